// Package setassoc holds the pieces shared by the project's fixed-size,
// set-associative caches (the key cache of package blockkeys, the parity and
// hold tables of package applier): how a 64-bit key picks its set, how a table
// size rounds to sets, and the bookkeeping of one set's ways. A table built on
// it never grows after construction and allocates nothing per entry; an
// insert into a full set replaces its ways round robin (about oldest first).
package setassoc

// Ways is the associativity of every table built on this package.
const Ways = 4

// SetIndex spreads engine hashes over sets. Engine hashes are usually digests
// already, but older engines sent Python hash() ints, which are not uniform.
func SetIndex(k uint64, shift uint) uint64 {
	return (k * 0x9E3779B97F4A7C15) >> shift
}

// TableShape rounds entries up to a power-of-two number of sets.
func TableShape(entries int) (sets int, shift uint) {
	if entries < Ways {
		entries = Ways
	}
	sets, shift = 1, 64
	for sets*Ways < entries {
		sets <<= 1
		shift--
	}
	return sets, shift
}

// Set is the key part of one set of a table; a table embeds it beside its
// values array of Ways entries.
type Set struct {
	Keys  [Ways]uint64
	Valid uint8
	Next  uint8
}

// Find returns the way holding k, or -1.
func (s *Set) Find(k uint64) int {
	for w := 0; w < Ways; w++ {
		if s.Valid&(1<<w) != 0 && s.Keys[w] == k {
			return w
		}
	}
	return -1
}

// Slot picks the way for k: its current way, else a free one, else
// round-robin. The caller stores its value there, then calls Fill.
func (s *Set) Slot(k uint64) int {
	free := -1
	for w := 0; w < Ways; w++ {
		if s.Valid&(1<<w) == 0 {
			if free < 0 {
				free = w
			}
		} else if s.Keys[w] == k {
			return w
		}
	}
	if free >= 0 {
		return free
	}
	w := int(s.Next)
	s.Next = uint8((w + 1) % Ways)
	return w
}

// Fill marks way w as holding k.
func (s *Set) Fill(w int, k uint64) {
	s.Keys[w] = k
	s.Valid |= 1 << w
}
