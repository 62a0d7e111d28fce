package mooncake

import (
	"fmt"
	"slices"

	"github.com/kvindex/kvindex/sim"
)

// Request is one trace request after the length and duplication factors,
// assigned to one inference worker.
type Request struct {
	Timestamp int64    // ms, as in the trace
	HashIDs   []uint64 // expanded block ids: one per BlockSize tokens
}

// Shape is how the trace becomes per-worker request lists; each field is a
// mooncake_bench parameter of the same meaning (docs/performance.md maps them).
type Shape struct {
	// Workers is the number of unique simulated inference workers.
	Workers int
	// LengthFactor stretches every request: hash id h becomes the
	// LengthFactor blocks h*f .. h*f+f-1, so two requests that shared k
	// blocks now share k*f.
	LengthFactor int
	// DupFactor copies the whole trace DupFactor times into disjoint hash
	// spaces (copy d adds d*(max id+1) to every id): the same tree shape,
	// DupFactor times the distinct blocks and requests.
	DupFactor int
	// Seed draws each request's worker.
	Seed uint64
	// MaxRequests keeps only the first MaxRequests trace lines (0 = all),
	// for the short run.
	MaxRequests int
}

func (s Shape) validate() error {
	if s.Workers <= 0 || s.Workers > 1<<16 {
		return fmt.Errorf("mooncake: workers %d out of range 1..65536", s.Workers)
	}
	if s.LengthFactor <= 0 || s.DupFactor <= 0 {
		return fmt.Errorf("mooncake: length and duplication factors must be >= 1")
	}
	return nil
}

// Partition applies the factors to trace and deals its requests to
// s.Workers workers at random (seeded), each worker's list in time order.
func Partition(trace []sim.Request, s Shape) ([][]Request, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	if s.MaxRequests > 0 && len(trace) > s.MaxRequests {
		trace = trace[:s.MaxRequests]
	}
	var maxID uint64
	for _, r := range trace {
		for _, h := range r.HashIDs {
			maxID = max(maxID, h)
		}
	}
	f := uint64(s.LengthFactor)
	if maxID >= (1<<32)/f/uint64(s.DupFactor) {
		return nil, fmt.Errorf("mooncake: expanded block ids exceed 32 bits (max id %d)", maxID)
	}
	span := (maxID + 1) * f // copy d's ids start at d*span
	out := make([][]Request, s.Workers)
	rng := s.Seed
	for _, r := range trace {
		for d := 0; d < s.DupFactor; d++ {
			ids := make([]uint64, 0, len(r.HashIDs)*s.LengthFactor)
			for _, h := range r.HashIDs {
				for i := uint64(0); i < f; i++ {
					ids = append(ids, uint64(d)*span+h*f+i)
				}
			}
			rng += golden
			w := int(mix64(rng) % uint64(s.Workers))
			out[w] = append(out[w], Request{Timestamp: r.Timestamp, HashIDs: ids})
		}
	}
	for _, w := range out {
		slices.SortStableFunc(w, func(a, b Request) int { return int(a.Timestamp - b.Timestamp) })
	}
	return out, nil
}

const golden = 0x9e3779b97f4a7c15

// mix64 is SplitMix64's output function: a bijection of uint64, so dense
// block ids become distinct, evenly spread 64-bit keys, and a counter
// stepped by golden becomes a random sequence.
func mix64(x uint64) uint64 {
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
