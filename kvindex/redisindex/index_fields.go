package redisindex

import (
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// Names in Redis: a holder's hash field and a block's key (see doc.go for
// the schema), with the caches that keep building them off the hot path.

func (x *Index) podFieldOf(p kvindex.PodID) string {
	x.nmu.RLock()
	s, ok := x.podField[p]
	x.nmu.RUnlock()
	if ok {
		return s
	}
	name, rank := x.in.PodName(p)
	s = strconv.Itoa(rank) + "." + name
	x.nmu.Lock()
	x.podField[p] = s
	x.nmu.Unlock()
	return s
}

func (x *Index) holderField(h kvindex.Holder) string {
	x.nmu.RLock()
	s, ok := x.holderF[h]
	x.nmu.RUnlock()
	if ok {
		return s
	}
	s = strconv.Itoa(int(h.Tier)) + ".0." + x.podFieldOf(h.Pod)
	x.nmu.Lock()
	x.holderF[h] = s
	x.nmu.Unlock()
	return s
}

// parseField turns "<tier>.0.<rank>.<pod name>" into a Holder. The 0 is
// part of the format every daemon sharing the namespace reads and writes
// (the scripts' podOf skips it too); a record with another value there was
// not written by this version and is not read (counted as malformed).
func (x *Index) parseField(f string) (kvindex.Holder, bool) {
	x.nmu.RLock()
	h, ok := x.fields[f]
	x.nmu.RUnlock()
	if ok {
		return h, true
	}
	parts := strings.SplitN(f, ".", 4)
	if len(parts) != 4 || parts[3] == "" {
		return h, false
	}
	tier, e1 := strconv.ParseUint(parts[0], 10, 8)
	rank, e2 := strconv.ParseInt(parts[2], 10, 32)
	if e1 != nil || parts[1] != "0" || e2 != nil || tier >= uint64(event.NumTiers) || rank < 0 {
		return h, false
	}
	h = kvindex.Holder{Pod: x.in.Pod(parts[3], int(rank)), Tier: event.Tier(tier)}
	x.nmu.Lock()
	if len(x.fields) < maxFieldCache {
		x.fields[f] = h
	}
	x.nmu.Unlock()
	return h, true
}

// parsePodField turns "<rank>.<pod name>" into a PodID.
func (x *Index) parsePodField(f string) (kvindex.PodID, bool) {
	r, name, ok := strings.Cut(f, ".")
	if !ok || name == "" {
		return 0, false
	}
	rank, err := strconv.ParseInt(r, 10, 32)
	if err != nil || rank < 0 {
		return 0, false
	}
	return x.in.Pod(name, int(rank)), true
}

// modelPrefix is "<ns>:b:<model>:". '{', '}' and '%' in model names are
// %-escaped so a model name can never become a Cluster hash tag (which would
// put every block of that model in one slot).
func (x *Index) modelPrefix(m kvindex.ModelID) string {
	x.nmu.RLock()
	s, ok := x.modelPfx[m]
	x.nmu.RUnlock()
	if ok {
		return s
	}
	s = x.modelPrefixOf(x.in.ModelName(m))
	x.nmu.Lock()
	x.modelPfx[m] = s
	x.nmu.Unlock()
	return s
}

const hexDigits = "0123456789abcdef"

// blockKeysInto is blockKeys into a reused buffer: the strings it returns
// are views of buf and change when buf is reused, so they must not outlive
// the caller's use of buf (Lookup clones the few it keeps).
func blockKeysInto(dst []string, buf []byte, prefix string, keys []blockkeys.Key) ([]string, []byte) {
	n := len(prefix) + 16
	buf = slices.Grow(buf[:0], n*len(keys))
	for _, k := range keys {
		buf = append(buf, prefix...)
		for s := 60; s >= 0; s -= 4 {
			buf = append(buf, hexDigits[(uint64(k)>>uint(s))&0xf])
		}
	}
	all := unsafe.String(unsafe.SliceData(buf), len(buf))
	for i := range keys {
		dst = append(dst, all[i*n:(i+1)*n])
	}
	return dst, buf
}

// blockKeys fills dst with prefix+16 hex digits per key, building all of them
// in one string allocation.
func blockKeys(dst []string, prefix string, keys []blockkeys.Key) []string {
	n := len(prefix) + 16
	buf := make([]byte, 0, n*len(keys))
	for _, k := range keys {
		buf = append(buf, prefix...)
		for s := 60; s >= 0; s -= 4 {
			buf = append(buf, hexDigits[(uint64(k)>>uint(s))&0xf])
		}
	}
	all := string(buf)
	for i := range keys {
		dst = append(dst, all[i*n:(i+1)*n])
	}
	return dst
}

// ---- epochs ------------------------------------------------------------
