package indexer

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Op is a request kind the stage histograms are kept for.
type Op uint8

const (
	OpScore Op = iota
	OpPick
	numOps
)

func (o Op) String() string { return [...]string{"score", "pick"}[o] }

// Stage is one step of a score or pick request, timed into
// kvindexd_request_stage_seconds so a dashboard shows which step grew.
// Parse and encode are the transport's (package api observes them through
// ObserveStage); the others are timed here.
type Stage uint8

const (
	// StageParse: the request body or message decoded into a query.
	StageParse Stage = iota
	// StageRender: a chat request rendered through the model's template.
	StageRender
	// StageTokenize: prompt or rendered text to token ids (prefix store).
	StageTokenize
	// StageKeys: token ids to block keys, for every applied engine.
	StageKeys
	// StageLookup: the index (and for Pick the speculative entries and
	// routing history) matched against the keys.
	StageLookup
	// StagePolicy: Pick's policy decision and the record of the pick.
	StagePolicy
	// StageEncode: the answer encoded for the transport.
	StageEncode
	numStages
)

func (s Stage) String() string {
	return [...]string{"parse", "render", "tokenize", "keys", "lookup", "policy", "encode"}[s]
}

// stageMetrics holds the histogram's series resolved once: observing is an
// array index and an atomic add, no label lookup.
type stageMetrics [numOps][numStages]prometheus.Observer

func newStageMetrics(reg prometheus.Registerer) (*stageMetrics, error) {
	vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvindexd_request_stage_seconds",
		Help: "Time per stage of a score or pick request (op) inside the daemon: parse, render, tokenize, keys, lookup, policy (pick), encode.",
		// 250 ns to ~2.3 s: a parse of a few ids to a long chat render.
		Buckets: prometheus.ExponentialBuckets(2.5e-7, 2.5, 18),
	}, []string{"op", "stage"})
	if err := reg.Register(vec); err != nil {
		return nil, err
	}
	m := new(stageMetrics)
	for o := range numOps {
		for s := range numStages {
			if o == OpScore && s == StagePolicy {
				continue // score has no policy: no empty series
			}
			m[o][s] = vec.WithLabelValues(o.String(), s.String())
		}
	}
	return m, nil
}

// ObserveStage records d for a stage of op; the transport calls it for
// StageParse and StageEncode. StagePolicy of OpScore is ignored.
func (ix *Indexer) ObserveStage(op Op, s Stage, d time.Duration) {
	if op < numOps && s < numStages {
		if o := ix.stages[op][s]; o != nil {
			o.Observe(d.Seconds())
		}
	}
}

// stageClock times consecutive stages of one request: each lap observes
// the time since the previous one.
type stageClock struct {
	m    *[numStages]prometheus.Observer
	last time.Time
}

func (ix *Indexer) clock(op Op) stageClock {
	return stageClock{m: &ix.stages[op], last: time.Now()}
}

// lap observes the time since the last lap (or the start) as stage s.
func (c *stageClock) lap(s Stage) {
	now := time.Now()
	if o := c.m[s]; o != nil {
		o.Observe(now.Sub(c.last).Seconds())
	}
	c.last = now
}

// split observes d of the time since the last lap as stage s and leaves
// the rest to the next lap (a chat request's render inside its tokenize).
func (c *stageClock) split(s Stage, d time.Duration) {
	if o := c.m[s]; o != nil {
		o.Observe(d.Seconds())
	}
	c.last = c.last.Add(d)
}
