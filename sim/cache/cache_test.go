package cache

import (
	"reflect"
	"testing"
)

func access(p Policy, keys ...uint64) (evicted []uint64) {
	for _, k := range keys {
		evicted = p.Access(k, evicted)
	}
	return evicted
}

func TestLRU(t *testing.T) {
	c := NewLRU(2)
	// a, b fill the cache; touching a makes b the least recent; c evicts b.
	if ev := access(c, 1, 2, 1, 3); !reflect.DeepEqual(ev, []uint64{2}) {
		t.Fatalf("evicted %v, want [2]", ev)
	}
	if !c.Contains(1) || c.Contains(2) || !c.Contains(3) || c.Len() != 2 {
		t.Fatalf("state wrong: 1:%v 2:%v 3:%v len %d", c.Contains(1), c.Contains(2), c.Contains(3), c.Len())
	}
}

func TestLFU(t *testing.T) {
	// Lowest count goes: a has 2, b has 1 -> c evicts b.
	c := NewLFU(2)
	if ev := access(c, 1, 1, 2, 3); !reflect.DeepEqual(ev, []uint64{2}) {
		t.Fatalf("evicted %v, want [2]", ev)
	}
	// Equal counts (a=2, b=2), b accessed last -> tie broken by least recent: a goes.
	c = NewLFU(2)
	if ev := access(c, 1, 2, 1, 2, 3); !reflect.DeepEqual(ev, []uint64{1}) {
		t.Fatalf("evicted %v, want [1]", ev)
	}
	// A re-admitted block starts again at count 1: a(3) b(1); c evicts b;
	// b returns with count 1 and evicts c (count 1, older) not a.
	c = NewLFU(2)
	if ev := access(c, 1, 1, 1, 2, 3, 2); !reflect.DeepEqual(ev, []uint64{2, 3}) {
		t.Fatalf("evicted %v, want [2 3]", ev)
	}
	if !c.Contains(1) || !c.Contains(2) || c.Len() != 2 {
		t.Fatal("want {1,2} resident")
	}
}

// Mistake: int() instead of round() (banker's) for small_cap.
func TestS3FIFOSmallCapBankersRounding(t *testing.T) {
	for _, tc := range []struct {
		capacity int
		want     int
	}{
		{4096, 410}, // 409.6: int() would give 409
		{25, 2},     // 2.5: half-even gives 2, half-up would give 3
		{45, 4},     // 4.5 -> 4
		{15, 2},     // 1.5 -> 2
	} {
		if got := SmallCap(tc.capacity, 0.1); got != tc.want {
			t.Errorf("SmallCap(%d, 0.1) = %d, want %d", tc.capacity, got, tc.want)
		}
	}
	// Behaviour: capacity 25 -> S holds 2. Admitting 1, 2, 3 (all freq 0)
	// drains S's head 1 to the ghost; with S=3 (half-up) 1 would still be resident.
	c, err := NewS3FIFO(25, 0.1, 3)
	if err != nil {
		t.Fatal(err)
	}
	if s, m, g := c.Sizes(); s != 2 || m != 23 || g != 23 {
		t.Fatalf("sizes %d/%d/%d, want 2/23/23", s, m, g)
	}
	if ev := access(c, 1, 2, 3); !reflect.DeepEqual(ev, []uint64{1}) || c.Contains(1) {
		t.Fatalf("evicted %v, want [1] and 1 not resident", ev)
	}
}

// Mistake: ghost_cap = small_cap. Capacity 10: S=1, M=9, G=9.
func TestS3FIFOGhostCapIsMainCap(t *testing.T) {
	c, _ := NewS3FIFO(10, 0.1, 3)
	// Each new block pushes the previous one (freq 0) from S to G:
	// after 1..11, S=[11], G=[2..10] (1 fell off the 9-entry ghost).
	access(c, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
	if s, m, g := c.QueueLens(); s != 1 || m != 0 || g != 9 {
		t.Fatalf("|S|,|M|,|G| = %d,%d,%d, want 1,0,9", s, m, g)
	}
	// 2 is still remembered (a 1-entry ghost would only know 10): ghost hit -> M, freq 0.
	access(c, 2)
	if f, q := c.Freq(2); q != "M" || f != 0 {
		t.Fatalf("2 is %q freq %d, want M freq 0", q, f)
	}
	// 1 was dropped from the ghost: it is brand new again and lands in S.
	access(c, 1)
	if _, q := c.Freq(1); q != "S" {
		t.Fatalf("1 is in %q, want S", q)
	}
}

// Mistake: resetting freq on S->M promotion.
func TestS3FIFOFreqKeptOnPromotion(t *testing.T) {
	c, _ := NewS3FIFO(10, 0.1, 3)
	access(c, 1, 1, 1) // 1 in S with freq 2
	access(c, 2)       // S full: 1 (freq 2 >= 1) is promoted with freq 2
	if f, q := c.Freq(1); q != "M" || f != 2 {
		t.Fatalf("1 is %q freq %d, want M freq 2", q, f)
	}
}

// Mistakes: M eviction as plain FIFO, and requeueing at the head instead of the tail.
func TestS3FIFOSecondChanceRequeueAtTail(t *testing.T) {
	// capacity 4, ratio 0.25: S=1, M=3, G=3.
	c, _ := NewS3FIFO(4, 0.25, 3)
	// a,a: a in S freq 1. b: a->M(1). b: b freq 1. c: b->M(1). c. d: c->M(1). M=[a1,b1,c1].
	access(c, 1, 1, 2, 2, 3, 3, 4, 4)
	// d is in S with freq 1. e: d is promoted; M is full: a1->tail a0, b1->b0,
	// c1->c0, then a0 is the one real eviction. M=[b0,c0,d1], S=[e].
	if ev := access(c, 5); !reflect.DeepEqual(ev, []uint64{1}) {
		t.Fatalf("evicted %v, want [1]", ev)
	}
	access(c, 2)       // b: freq 1 (in M). M=[b1,c0,d1]
	access(c, 5)       // e: freq 1 (in S)
	ev := access(c, 6) // f: e promoted; M full: b1 -> tail as b0; c0 is evicted.
	// Plain FIFO would evict b (the head); requeue-at-head would re-pop b0 at once.
	if !reflect.DeepEqual(ev, []uint64{3}) {
		t.Fatalf("evicted %v, want [3] (c)", ev)
	}
	if !c.Contains(2) || c.Contains(3) {
		t.Fatal("b must survive its second chance, c must be gone")
	}
	if f, q := c.Freq(2); q != "M" || f != 0 {
		t.Fatalf("b is %q freq %d, want M freq 0 after one requeue", q, f)
	}
}

// Mistake: forgetting to saturate freq.
func TestS3FIFOFreqSaturates(t *testing.T) {
	c, _ := NewS3FIFO(10, 0.1, 3)
	access(c, 1, 1, 1, 1, 1, 1, 1)
	if f, _ := c.Freq(1); f != 3 {
		t.Fatalf("freq %d, want 3 (saturated)", f)
	}
	c, _ = NewS3FIFO(10, 0.1, 1)
	access(c, 1, 1, 1)
	if f, _ := c.Freq(1); f != 1 {
		t.Fatalf("freq %d, want 1 with max-freq 1", f)
	}
	// Saturation bounds the second chances: a block accessed five times gets
	// exactly 3 requeues in M, not 5. Capacity 4 (S=1, M=3, G=3); a=1..e=5.
	c, _ = NewS3FIFO(4, 0.25, 3)
	access(c, 1, 1, 1, 1, 1, 1) // a: freq 3 in S (5 without the clamp)
	access(c, 2)                // a -> M keeping 3. S=[b0]
	access(c, 2, 3, 3, 4)       // b->M(1), c->M(1): M=[a3,b1,c1], S=[d0]
	if f, q := c.Freq(1); q != "M" || f != 3 {
		t.Fatalf("a is %q freq %d, want M 3", q, f)
	}
	// e: d0 -> G. Then ghost hits, each entering M with freq 0 and forcing
	// one real eviction from M:
	//   d: a3->a2, b1->b0, c1->c0, a2->a1 requeued; b0 out. M=[c0,a1,d0]
	//   b: c0 out. M=[a1,d0,b0]
	//   c: a1->a0 requeued; d0 out. M=[b0,a0,c0]
	//   d: b0 out. M=[a0,c0,d0]
	//   b: a0 out: a's second chances are used up.
	// Unclamped (a5) the last step would requeue a (a2->a1) and evict c.
	access(c, 5, 4, 2, 3, 4)
	if ev := access(c, 2); !reflect.DeepEqual(ev, []uint64{1}) {
		t.Fatalf("evicted %v, want [1] (a, after exactly 3 requeues)", ev)
	}
}

func TestS3FIFOFinalExcludesGhost(t *testing.T) {
	c, _ := NewS3FIFO(10, 0.1, 3)
	access(c, 1, 2, 3, 4, 5) // S=[5], G=[1,2,3,4]
	if c.Len() != 1 {
		t.Fatalf("Len %d, want 1 (|S|+|M|, not counting 4 ghosts)", c.Len())
	}
	for _, h := range []uint64{1, 2, 3, 4} {
		if c.Contains(h) {
			t.Fatalf("ghost %d reported resident", h)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Policy: "lru", Capacity: 0},
		{Policy: "arc", Capacity: 10},
		{Policy: "s3fifo", Capacity: 4, SmallRatio: 0.1}, // round(0.4)=0: no small queue
		{Policy: "s3fifo", Capacity: 10, SmallRatio: 1.5},
		{Policy: "s3fifo", Capacity: 10, SmallRatio: 0.1, MaxFreq: -1},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// Every policy must keep Len <= Capacity and report exactly the blocks that
// left the resident set.
func TestPoliciesEvictionAccounting(t *testing.T) {
	for _, name := range []string{"lru", "lfu", "s3fifo"} {
		p, err := New(Config{Policy: name, Capacity: 20})
		if err != nil {
			t.Fatal(err)
		}
		resident := map[uint64]bool{}
		var ev []uint64
		x := uint64(12345)
		for i := 0; i < 5000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
			h := (x >> 33) % 60
			ev = p.Access(h, ev[:0])
			for _, e := range ev {
				if !resident[e] {
					t.Fatalf("%s: evicted %d that was not resident", name, e)
				}
				delete(resident, e)
			}
			if p.Contains(h) {
				resident[h] = true
			}
			if p.Len() != len(resident) || p.Len() > p.Capacity() {
				t.Fatalf("%s: Len %d, tracked %d, cap %d", name, p.Len(), len(resident), p.Capacity())
			}
		}
		for h := range resident {
			if !p.Contains(h) {
				t.Fatalf("%s: %d lost without an eviction report", name, h)
			}
		}
	}
}
