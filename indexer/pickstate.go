package indexer

import (
	"fmt"
	"time"

	"github.com/kvindex/kvindex/indexer/routing"
)

// PickConfig configures Pick: its policies, speculative entries and the
// routing history of pods without events. The zero value is the documented
// defaults.
type PickConfig struct {
	// DefaultPolicy answers a Pick that names none ("" = routing.DefaultPolicy).
	DefaultPolicy string
	// Params are the policies' knobs (nil = routing.Defaults()).
	Params *routing.Params
	// SpeculativeTTL is how long the pod a Pick chose is assumed to hold the
	// request's blocks before its own events say so (0 =
	// Options.SpeculativeTTL's default; negative turns speculation off).
	SpeculativeTTL time.Duration
	// SpeculativeCapacity bounds the in-process speculative entries
	// ((block, pod) pairs; 0 = Options.SpeculativeCapacity's default).
	SpeculativeCapacity int
	// HistoryTTL is how long a pick is remembered for candidates without
	// KV events (0 = Options.HistoryTTL's default; negative turns the
	// routing history off).
	HistoryTTL time.Duration
	// HistoryCapacity bounds the routing history ((block, pod) pairs;
	// 0 = Options.HistoryCapacity's default).
	HistoryCapacity int
	// FeedbackCapacity bounds the picks awaiting their engine's feedback
	// (0 = Options.FeedbackCapacity's default); when full, a new pick
	// drops the oldest, counted.
	FeedbackCapacity int
	// FeedbackTTL is how long a pick awaits its feedback (0 =
	// Options.FeedbackTTL's default).
	FeedbackTTL time.Duration
	// Now is the clock of both TTLs (nil = time.Now); tests and the
	// simulator inject theirs.
	Now func() time.Time
}

// maxHoldCapacity bounds either hold map (Options.HistoryCapacity).
const maxHoldCapacity = 1 << 26

// picker is Pick's state beside the index: the policies, the speculative
// store and the routing history.
type picker struct {
	order []routing.Policy // index = policy number in metrics
	def   int
	now   func() time.Time
	// spec is the speculative store (nil = off); specMem is set when it is
	// the in-process one, whose emptiness Pick checks for free.
	spec    SpeculativeStore
	specMem *holdMap
	hist    *holdMap // nil = off
	// pd is the disaggregation decision of P/D picks.
	pd routing.PDParams
}

// newPicker builds the pick state. shared returns the store speculative
// entries are shared through (Redis), or nil to keep them in process.
func newPicker(cfg PickConfig, shared func(ttl time.Duration) (SpeculativeStore, error)) (*picker, error) {
	params := routing.Defaults()
	if cfg.Params != nil {
		params = *cfg.Params
	}
	if err := params.PD.Validate(); err != nil {
		return nil, fmt.Errorf("indexer: pick: %w", err)
	}
	p := &picker{now: cfg.Now, pd: params.PD}
	if p.now == nil {
		p.now = time.Now
	}
	def := cfg.DefaultPolicy
	if def == "" {
		def = routing.DefaultPolicy
	}
	p.def = -1
	for _, name := range routing.Names() {
		pol, err := routing.New(name, params)
		if err != nil {
			return nil, fmt.Errorf("indexer: pick: %w", err)
		}
		if name == def {
			p.def = len(p.order)
		}
		p.order = append(p.order, pol)
	}
	if p.def < 0 {
		_, err := routing.New(def, params)
		return nil, fmt.Errorf("indexer: pick: default policy: %w", err)
	}
	// The TTLs and capacities come resolved and checked (options.go).
	if ttl := cfg.SpeculativeTTL; ttl > 0 {
		s, err := shared(ttl)
		if err != nil {
			return nil, fmt.Errorf("indexer: pick: speculative store: %w", err)
		}
		p.spec = s
		if p.spec == nil {
			p.specMem = newHoldMap(int64(ttl), cfg.SpeculativeCapacity)
			p.spec = &memSpec{h: p.specMem, now: p.now}
		}
	}
	if ttl := cfg.HistoryTTL; ttl > 0 {
		p.hist = newHoldMap(int64(ttl), cfg.HistoryCapacity)
	}
	return p, nil
}
