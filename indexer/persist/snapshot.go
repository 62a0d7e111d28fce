// Package persist persists the in-memory index to a file and loads it back,
// so a restarted daemon does not answer empty scores until its engines have
// re-announced their caches.
//
// # Format (version 1, little-endian)
//
//	"KVIXSNAP" u32 version  i64 created (Unix ns)  u64 probe key
//	uvarint models, each: uvarint id (= its position), string name, u64 SlotKeyOf(id, probe)
//	uvarint pods, each: string name, uvarint dp rank, u8 has seq, uvarint seq
//	    (version 2: u8 flags, bit 0 has seq, bit 1 complete, uvarint seq, and
//	    when complete uvarint complete-since seq)
//	blocks, each: u8 1, u64 slot key, uvarint holders, each: uvarint pod (its
//	    position in the pod table), uvarint tier
//	u8 0, u64 blocks, u64 entries
//	u32 CRC-32C of everything before it
//
// Strings are a uvarint length and the bytes. A file is about 9 bytes per
// block plus 2-3 per (block, pod) entry, so its size follows the index's.
//
// Blocks are stored as the memory index stores them (kvindex.SlotKey, the
// key mixed with its model's id), so the model table must intern to the
// same ids on load; the probe keys check that the mixing is the same too.
// Loading happens before the daemon takes any event, on a fresh interner.
//
// Writes are atomic: a temporary file in the same directory, fsync, rename,
// fsync of the directory. Loads check the checksum over the whole file
// before touching the index, then every count against the bytes left, so a
// truncated or corrupt file is a clear error and a cold start, never a crash
// or a half-loaded index.
package persist

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

const (
	magic   = "KVIXSNAP"
	version = 1
	// version2 adds each stream's completeness, which only a copy for a
	// peer records (StreamSeq.Complete); a file without it stays version 1.
	version2 = 2
	// probeKey is any fixed key: its slot key per model pins the mixing.
	probeKey   = blockkeys.Key(0x6b76696e64657821)
	maxNameLen = 1 << 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// StreamSeq is the last sequence number applied for one (pod, rank) stream.
type StreamSeq struct {
	Pod    string
	DPRank int
	Seq    uint64
	// Complete: the stream's run was unbroken since CompleteSince (0 = an
	// empty cache), as kvevents.StreamStats says. Only a copy for a live
	// peer records it: a file is loaded after a downtime nothing vouches for.
	Complete      bool
	CompleteSince uint64
}

// BlockRanger walks an index's blocks (kvindex.MemoryIndex.RangeBlocks).
type BlockRanger interface {
	RangeBlocks(fn func(k kvindex.SlotKey, holders []kvindex.Holder) error) error
}

// Source is what a snapshot is taken of.
type Source struct {
	Index    BlockRanger
	Interner *kvindex.Interner
	// Streams returns the streams' last sequence numbers; it is called
	// before the index is read, so the content is at least that new.
	Streams func() []StreamSeq
}

// Written describes one snapshot file.
type Written struct {
	Blocks, Entries, Bytes int64
	Pods, Models           int
}

// Write takes a snapshot of src into path atomically.
func Write(path string, src Source, now time.Time) (Written, error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return Written{}, fmt.Errorf("snapshot: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if f != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	w, err := Encode(f, src, now)
	if err != nil {
		return w, fmt.Errorf("%w (%s)", err, tmp)
	}
	if err := f.Sync(); err != nil {
		return w, fmt.Errorf("snapshot: fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return w, fmt.Errorf("snapshot: close %s: %w", tmp, err)
	}
	f = nil
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return w, fmt.Errorf("snapshot: %w", err)
	}
	// The rename is durable only once the directory is.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return w, nil
}

// countingWriter counts the bytes of a snapshot as they are written.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// Encode writes a snapshot of src to out: the file's bytes, checksum
// included, so a peer's copy streamed over HTTP (indexer/peer.go) is the
// same format a file is and is loaded by the same code.
func Encode(out io.Writer, src Source, now time.Time) (Written, error) {
	var w Written
	var seqs map[StreamSeq]StreamSeq
	ver := uint32(version)
	if src.Streams != nil {
		ss := src.Streams()
		seqs = make(map[StreamSeq]StreamSeq, len(ss))
		for _, s := range ss {
			seqs[StreamSeq{Pod: s.Pod, DPRank: s.DPRank}] = s
			if s.Complete {
				ver = version2
			}
		}
	}
	cw := &countingWriter{w: out}
	crc := crc32.New(castagnoli)
	bw := bufio.NewWriterSize(io.MultiWriter(cw, crc), 1<<20)
	e := encoder{w: bw}
	e.raw([]byte(magic))
	e.u32(ver)
	e.u64(uint64(now.UnixNano()))
	e.u64(uint64(probeKey))

	// Models and pods are interned densely from 0, so their tables are the
	// ids in order; pods are written by id and holders refer to them so.
	nm := src.Interner.NumModels()
	e.uvarint(uint64(nm))
	for id := range nm {
		e.uvarint(uint64(id))
		e.str(src.Interner.ModelName(kvindex.ModelID(id)))
		e.u64(uint64(kvindex.SlotKeyOf(kvindex.ModelID(id), probeKey)))
	}
	np := src.Interner.NumPods()
	e.uvarint(uint64(np))
	for id := range np {
		name, rank := src.Interner.PodName(kvindex.PodID(id))
		e.str(name)
		e.uvarint(uint64(rank))
		ss, ok := seqs[StreamSeq{Pod: name, DPRank: rank}]
		var flags byte
		if ok {
			flags |= 1
		}
		if ok && ss.Complete {
			flags |= 2
		}
		e.u8(flags)
		e.uvarint(ss.Seq)
		if flags&2 != 0 {
			e.uvarint(ss.CompleteSince)
		}
	}
	err := src.Index.RangeBlocks(func(k kvindex.SlotKey, hs []kvindex.Holder) error {
		n := 0
		for _, h := range hs {
			if int(h.Pod) < np {
				n++
			}
		}
		if n == 0 {
			return nil
		}
		e.u8(1)
		e.u64(uint64(k))
		e.uvarint(uint64(n))
		for _, h := range hs {
			if int(h.Pod) < np {
				e.uvarint(uint64(h.Pod))
				e.uvarint(uint64(h.Tier))
			}
		}
		w.Blocks++
		w.Entries += int64(n)
		return e.err
	})
	if err != nil {
		return w, fmt.Errorf("snapshot: %w", err)
	}
	// A model interned during the walk may have blocks in it under an id
	// the model table does not name; loaded, they could surface under
	// another model given that id. Such a snapshot is dropped; the next
	// interval writes a complete one.
	if n := src.Interner.NumModels(); n != nm {
		return w, fmt.Errorf("snapshot: %d model(s) appeared while it was written; skipped, the next one will hold them", n-nm)
	}
	e.u8(0)
	e.u64(uint64(w.Blocks))
	e.u64(uint64(w.Entries))
	if e.err == nil {
		e.err = bw.Flush()
	}
	if e.err != nil {
		return w, fmt.Errorf("snapshot: write: %w", e.err)
	}
	var sum [4]byte
	binary.LittleEndian.PutUint32(sum[:], crc.Sum32())
	if _, err := cw.Write(sum[:]); err != nil {
		return w, fmt.Errorf("snapshot: write: %w", err)
	}
	w.Bytes = cw.n
	w.Pods, w.Models = np, nm
	return w, nil
}

type encoder struct {
	w   *bufio.Writer
	buf [binary.MaxVarintLen64]byte
	err error
}

func (e *encoder) raw(b []byte) {
	if e.err == nil {
		_, e.err = e.w.Write(b)
	}
}

func (e *encoder) u8(v byte) {
	if e.err == nil {
		e.err = e.w.WriteByte(v)
	}
}

func (e *encoder) u32(v uint32) { e.raw(binary.LittleEndian.AppendUint32(e.buf[:0], v)) }
func (e *encoder) u64(v uint64) { e.raw(binary.LittleEndian.AppendUint64(e.buf[:0], v)) }
func (e *encoder) uvarint(v uint64) {
	e.raw(binary.AppendUvarint(e.buf[:0], v))
}

func (e *encoder) str(s string) {
	e.uvarint(uint64(len(s)))
	if e.err == nil {
		_, e.err = e.w.WriteString(s)
	}
}

// RestoredPod is one pod of a loaded snapshot, under its id in the
// interner it was loaded into.
type RestoredPod struct {
	ID     kvindex.PodID
	Name   string
	DPRank int
	// Seq is the stream's last sequence number the content includes; HasSeq
	// is false for a pod whose stream was unknown when the snapshot was taken.
	Seq    uint64
	HasSeq bool
	// Complete: the peer the copy came from had the stream complete since
	// CompleteSince (version 2 only; never in a file).
	Complete      bool
	CompleteSince uint64
}

// Loaded describes a snapshot that was loaded.
type Loaded struct {
	Created         time.Time
	Pods            []RestoredPod
	Blocks, Entries int64
}

// ErrCorrupt wraps every reason a file cannot be loaded (bad magic, version,
// checksum, truncation, inconsistent counts).
var ErrCorrupt = errors.New("snapshot file is corrupt or truncated")

// Limits are the bounds events are held to (package kvevents), applied to a
// snapshot's tables: a file holding what no event could have created was not
// written by kvindexd, checksum or not. Zero fields are kvevents' defaults.
type Limits struct {
	MaxPods    int // (pod, DP rank) entries of the pod table: --max-streams
	MaxModels  int // --max-models
	MaxDPRanks int // a rank must be below it: --max-dp-ranks
}

func (l Limits) withDefaults() Limits {
	if l.MaxPods <= 0 {
		l.MaxPods = kvevents.DefaultMaxStreams
	}
	if l.MaxModels <= 0 {
		l.MaxModels = kvevents.DefaultMaxModels
	}
	if l.MaxDPRanks <= 0 {
		l.MaxDPRanks = kvevents.DefaultMaxDPRanks
	}
	return l
}

// ErrInvalid wraps every reason a file with a valid checksum is refused: a
// name events would have dropped (too long, invalid UTF-8, control
// characters), more pods or models than the limits, a DP rank beyond them.
var ErrInvalid = errors.New("snapshot holds what no event could have created")

// Load is LoadLimited with kvevents' default limits.
func Load(path string, idx *kvindex.MemoryIndex, in *kvindex.Interner) (*Loaded, error) {
	return LoadLimited(path, idx, in, Limits{})
}

// LoadLimited reads path into idx, interning its models and pods in in,
// which must be the fresh interner idx is used with (no model interned yet).
// Names and counts are checked against lim before they are interned. On any
// error nothing of the file stays visible in idx (its pods are cleared).
func LoadLimited(path string, idx *kvindex.MemoryIndex, in *kvindex.Interner, lim Limits) (*Loaded, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	l, err := LoadFrom(f, st.Size(), path, idx, in, lim)
	if l != nil {
		// A file is loaded after a downtime nothing vouches for, whatever
		// it says (kvindexd writes completeness only into a peer's copy).
		for i := range l.Pods {
			l.Pods[i].Complete, l.Pods[i].CompleteSince = false, 0
		}
	}
	return l, err
}

// LoadFrom is LoadLimited reading size bytes from r (a file, or a peer's
// copy held in memory); name is what errors call it.
func LoadFrom(r io.ReaderAt, size int64, name string, idx *kvindex.MemoryIndex, in *kvindex.Interner, lim Limits) (*Loaded, error) {
	path := name
	if size < int64(len(magic))+4+8+8+4 {
		return nil, fmt.Errorf("%w: %s: %d bytes", ErrCorrupt, path, size)
	}
	// Pass 1: the checksum, before anything is believed or allocated.
	crc := crc32.New(castagnoli)
	if _, err := io.Copy(crc, io.NewSectionReader(r, 0, size-4)); err != nil {
		return nil, fmt.Errorf("snapshot: read %s: %w", path, err)
	}
	var sum [4]byte
	if _, err := r.ReadAt(sum[:], size-4); err != nil {
		return nil, fmt.Errorf("snapshot: read %s: %w", path, err)
	}
	if binary.LittleEndian.Uint32(sum[:]) != crc.Sum32() {
		return nil, fmt.Errorf("%w: %s: checksum mismatch", ErrCorrupt, path)
	}
	// The trailer's block count sizes the tables before the blocks come
	// (see MemoryIndex.Reserve); bounded by the file, as each block takes
	// at least 10 bytes.
	var trailer [16]byte
	if _, err := r.ReadAt(trailer[:], size-4-16); err != nil {
		return nil, fmt.Errorf("snapshot: read %s: %w", path, err)
	}
	if blocks := binary.LittleEndian.Uint64(trailer[:8]); blocks <= uint64(size/10) {
		idx.Reserve(int64(blocks))
	}
	d := &decoder{r: bufio.NewReaderSize(io.NewSectionReader(r, 0, size-4), 1<<20), left: size - 4}
	l, err := load(d, idx, in, lim.withDefaults())
	if err != nil {
		if l != nil {
			for _, p := range l.Pods {
				_ = idx.ClearPod(context.Background(), p.ID)
			}
		}
		return nil, fmt.Errorf("snapshot %s: %w", path, err)
	}
	return l, nil
}

func load(d *decoder, idx *kvindex.MemoryIndex, in *kvindex.Interner, lim Limits) (*Loaded, error) {
	if string(d.bytes(len(magic))) != magic {
		return nil, fmt.Errorf("%w: not a kvindex snapshot", ErrCorrupt)
	}
	ver := d.u32()
	if d.err == nil && ver != version && ver != version2 {
		return nil, fmt.Errorf("snapshot version %d: this kvindexd reads versions %d and %d", ver, version, version2)
	}
	l := &Loaded{Created: time.Unix(0, int64(d.u64()))}
	probe := blockkeys.Key(d.u64())
	nm := d.count()
	if nm > lim.MaxModels {
		return nil, fmt.Errorf("%w: %d models, limit %d (--max-models)", ErrInvalid, nm, lim.MaxModels)
	}
	for i := range nm {
		id := d.uvarint()
		name := d.str()
		p := d.u64()
		if d.err != nil {
			return nil, d.err
		}
		if why := kvevents.NameProblem(name, kvevents.MaxModelNameBytes); why != "" {
			return nil, fmt.Errorf("%w: model %d: name %s", ErrInvalid, i, why)
		}
		if id != uint64(i) {
			return nil, fmt.Errorf("%w: model table out of order", ErrCorrupt)
		}
		if got := in.Model(name); got != kvindex.ModelID(id) || kvindex.SlotKeyOf(got, probe) != kvindex.SlotKey(p) {
			return nil, fmt.Errorf("the snapshot's model %q has id %d here (was %d) or another key layout: it cannot be loaded into this index", name, got, id)
		}
	}
	np := d.count()
	if np > lim.MaxPods {
		return nil, fmt.Errorf("%w: %d pods, limit %d (--max-streams)", ErrInvalid, np, lim.MaxPods)
	}
	ids := make([]kvindex.PodID, 0, np)
	for i := range np {
		name := d.str()
		rank := d.uvarint()
		has := d.u8()
		seq := d.uvarint()
		var since uint64
		if has&2 != 0 {
			since = d.uvarint()
		}
		if d.err != nil {
			return l, d.err
		}
		if (ver == version && has > 1) || has > 3 || has == 2 {
			return l, fmt.Errorf("%w: pod table", ErrCorrupt)
		}
		// checked before the name is interned: an interned name is exported
		// as a label, and one invalid label value fails every /metrics scrape
		if why := kvevents.NameProblem(name, kvevents.MaxPodNameBytes); why != "" {
			return l, fmt.Errorf("%w: pod %d: name %s", ErrInvalid, i, why)
		}
		if rank >= uint64(lim.MaxDPRanks) {
			return l, fmt.Errorf("%w: pod %d: DP rank %d, limit %d (--max-dp-ranks)", ErrInvalid, i, rank, lim.MaxDPRanks)
		}
		id := in.Pod(name, int(rank))
		ids = append(ids, id)
		l.Pods = append(l.Pods, RestoredPod{ID: id, Name: name, DPRank: int(rank), Seq: seq, HasSeq: has&1 != 0,
			Complete: has&2 != 0, CompleteSince: since})
	}
	var hs []kvindex.Holder
	for {
		tag := d.u8()
		if d.err != nil {
			return l, d.err
		}
		if tag == 0 {
			break
		}
		if tag != 1 {
			return l, fmt.Errorf("%w: block tag %d", ErrCorrupt, tag)
		}
		k := kvindex.SlotKey(d.u64())
		n := d.count()
		hs = hs[:0]
		for range n {
			p, tier := d.uvarint(), d.uvarint()
			if d.err != nil {
				return l, d.err
			}
			if p >= uint64(len(ids)) || tier >= uint64(event.NumTiers) {
				return l, fmt.Errorf("%w: holder out of range", ErrCorrupt)
			}
			hs = append(hs, kvindex.Holder{Pod: ids[p], Tier: event.Tier(tier)})
		}
		if d.err != nil {
			return l, d.err
		}
		if err := idx.RestoreBlock(k, hs); err != nil {
			return l, err
		}
		l.Blocks++
		l.Entries += int64(n)
	}
	blocks, entries := d.u64(), d.u64()
	if d.err != nil {
		return l, d.err
	}
	if d.left != 0 || int64(blocks) != l.Blocks || int64(entries) != l.Entries {
		return l, fmt.Errorf("%w: trailer counts %d blocks %d entries, read %d and %d", ErrCorrupt, blocks, entries, l.Blocks, l.Entries)
	}
	return l, nil
}

// decoder reads the body; the first error sticks and every later read
// returns zero values. left is the bytes not read yet.
type decoder struct {
	r    *bufio.Reader
	left int64
	err  error
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("%w: ends early", ErrCorrupt)
		}
		d.err = err
	}
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil || int64(n) > d.left {
		d.fail(io.ErrUnexpectedEOF)
		return nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(d.r, b); err != nil {
		d.fail(err)
		return nil
	}
	d.left -= int64(n)
	return b
}

func (d *decoder) u8() byte {
	if d.err != nil {
		return 0
	}
	b, err := d.r.ReadByte()
	if err != nil {
		d.fail(err)
		return 0
	}
	d.left--
	return b
}

func (d *decoder) fixed(n int) uint64 {
	var b [8]byte
	if d.err != nil || int64(n) > d.left {
		d.fail(io.ErrUnexpectedEOF)
		return 0
	}
	if _, err := io.ReadFull(d.r, b[:n]); err != nil {
		d.fail(err)
		return 0
	}
	d.left -= int64(n)
	return binary.LittleEndian.Uint64(b[:])
}

func (d *decoder) u32() uint32 { return uint32(d.fixed(4)) }
func (d *decoder) u64() uint64 { return d.fixed(8) }

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, err := binary.ReadUvarint(byteCounter{d})
	if err != nil {
		d.fail(err)
		return 0
	}
	return v
}

// count reads a count of items that take at least one byte each: more than
// the bytes left is corrupt (and would be an allocation bomb).
func (d *decoder) count() int {
	n := d.uvarint()
	if d.err == nil && n > uint64(d.left) {
		d.fail(fmt.Errorf("%w: count %d beyond the file", ErrCorrupt, n))
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.err == nil && n > maxNameLen {
		d.fail(fmt.Errorf("%w: name of %d bytes", ErrCorrupt, n))
	}
	return string(d.bytes(int(n)))
}

type byteCounter struct{ d *decoder }

func (b byteCounter) ReadByte() (byte, error) {
	if b.d.left <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	c, err := b.d.r.ReadByte()
	if err == nil {
		b.d.left--
	}
	return c, err
}

// RemoveTemp deletes the temporary files a write interrupted by a kill left
// next to path (Write creates them as <name>.tmp-*; a finished write renames
// its own). Call it at start, before the saver runs. It returns how many were
// removed; the first error is returned with the count so far.
func RemoveTemp(path string) (int, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), base+".tmp-") {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return n, err
		}
		n++
	}
	return n, nil
}
