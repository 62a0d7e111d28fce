package llmdproducer

import (
	"slices"
	"testing"
	"time"
)

// The speculative record: runs from block 0, upstream's expiry (a live
// entry keeps the expiry it was created with, as the first request to
// expire evicts a shared entry upstream), the cap with its sweep and drop
// count, and keys that tell models, salts and prefixes apart.
func TestSpecRecord(t *testing.T) {
	now := time.Unix(1000, 0)
	s := newSpecRecord(2*time.Second, 6, 42)
	s.now = func() time.Time { return now }
	toks := prompt(1, 4)
	k := s.keys(nil, "m", "", toks, blockSize)
	if len(k) != 4 || len(s.keys(nil, "m", "", toks[:3*blockSize+5], blockSize)) != 3 {
		t.Fatalf("keys of 4 blocks: %d", len(k))
	}
	// a different model, salt, token or seed changes every block's key;
	// a shared prefix keeps its keys
	other := slices.Clone(toks)
	other[2*blockSize] = 7
	ko := s.keys(nil, "m", "", other, blockSize)
	if !slices.Equal(ko[:2], k[:2]) || ko[2] == k[2] || ko[3] == k[3] {
		t.Errorf("a change in block 2: keys %x vs %x", ko, k)
	}
	for _, d := range [][]uint64{s.keys(nil, "m2", "", toks, blockSize), s.keys(nil, "m", "salt", toks, blockSize),
		s.keys(nil, "", "m", toks, blockSize), newSpecRecord(time.Second, 1, 43).keys(nil, "m", "", toks, blockSize)} {
		if d[0] == k[0] {
			t.Errorf("keys %x collide with %x", d, k)
		}
	}

	s.record("a", k[:2])
	if got := s.run("a", k); got != 2 {
		t.Errorf("run after 2 blocks recorded: %d", got)
	}
	if got := s.run("b", k); got != 0 {
		t.Errorf("another endpoint's run: %d", got)
	}
	if got := s.run("a", ko[2:]); got != 0 {
		t.Errorf("run not from block 0: %d", got)
	}
	now = now.Add(time.Second)
	s.record("a", k) // blocks 0-1 keep their expiry, 2-3 get a later one
	now = now.Add(1500 * time.Millisecond)
	if got := s.run("a", k); got != 0 {
		t.Errorf("blocks 0-1 expired, run %d", got)
	}
	s.record("a", k[:2]) // expired entries are renewed
	if got := s.run("a", k); got != 4 {
		t.Errorf("renewed run %d, want 4", got)
	}

	// the cap: 4 entries of a, 2 of b fill it; more are dropped until a
	// sweep finds expired ones
	s.record("b", k[:2])
	s.record("c", k)
	if n, dropped := s.stats(); n != 6 || dropped != 4 || s.run("c", k) != 0 {
		t.Errorf("at the cap: %d entries, %d dropped, run %d", n, dropped, s.run("c", k))
	}
	now = now.Add(3 * time.Second) // everything expired
	s.record("c", k[:3])
	if n, dropped := s.stats(); n != 3 || dropped != 4 || s.run("c", k) != 3 {
		t.Errorf("after the sweep: %d entries, %d dropped, run %d", n, dropped, s.run("c", k))
	}
}
