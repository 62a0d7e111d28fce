package mooncake

import (
	"context"
	"time"
)

// Point is one step of a sweep: how much was offered and whether it kept up.
type Point struct {
	Fraction float64 // of the probe's achieved rate
	*Result
}

// Saturation finds the highest offered load the indexer keeps up with, as
// mooncake_bench's sweep does by compressing the trace into shorter
// windows: a probe far beyond capacity measures what the indexer achieves
// when overloaded, then windows offering fractions of that (from the top
// down, 5% apart near the threshold) until one keeps up. It returns that
// run and every run made; each run starts from an empty index.
func Saturation(ctx context.Context, c *Corpus, rc RunConfig, fractions []float64, each func(Point)) (sat *Point, all []Point, err error) {
	// The probe offers a block rate no single core reaches, bounded below
	// so the window stays long enough to time.
	probe := rc
	probe.Window = max(time.Duration(float64(c.Totals.Blocks())/2e9*float64(time.Second)), 50*time.Millisecond)
	pr, err := Replay(ctx, c, probe)
	if err != nil {
		return nil, nil, err
	}
	p0 := Point{Fraction: 0, Result: pr}
	all = append(all, p0)
	each(p0)
	achieved := pr.AchievedBlocks()
	var prev float64
	for _, f := range fractions {
		r, err := Replay(ctx, c, atRate(c, rc, achieved*f))
		if err != nil {
			return nil, all, err
		}
		p := Point{Fraction: f, Result: r}
		all = append(all, p)
		each(p)
		if !r.KeptUp {
			prev = f
			continue
		}
		sat = &p
		if prev > 0 && prev-f > 0.06 { // one step between the last failure and this success
			mid := (prev + f) / 2
			r, err := Replay(ctx, c, atRate(c, rc, achieved*mid))
			if err != nil {
				return nil, all, err
			}
			pm := Point{Fraction: mid, Result: r}
			all = append(all, pm)
			each(pm)
			if r.KeptUp {
				sat = &pm
			}
		}
		return sat, all, nil
	}
	return nil, all, nil
}

// DefaultFractions are the sweep's steps below the probe's achieved rate.
var DefaultFractions = []float64{1.2, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1}

// AtLoad replays c offering fraction of the saturation point's block rate.
func AtLoad(ctx context.Context, c *Corpus, rc RunConfig, sat *Result, fraction float64) (*Result, error) {
	return Replay(ctx, c, atRate(c, rc, sat.OfferedBlocks()*fraction))
}

// atRate is rc with the window that offers blocksPerSec.
func atRate(c *Corpus, rc RunConfig, blocksPerSec float64) RunConfig {
	rc.Window = time.Duration(float64(c.Totals.Blocks()) / blocksPerSec * float64(time.Second))
	return rc
}
