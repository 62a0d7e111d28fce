package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/kvindex/kvindex/sim/cache"
)

// endpoint is one pod as a scheduler sees it when a request arrives.
// Waiting, Running and KVUsage are the pod's scraped metrics (refreshed every
// metrics_interval_s, as an endpoint picker scrapes vLLM); InFlight is the
// scheduler's own live count of requests it sent there that have not
// finished; MatchedBlocks is what our precise index (fed by the pods' KV
// events) says the pod holds of the request: leading blocks.
type endpoint struct {
	Pod           int
	Waiting       int
	Running       int
	KVUsage       float64
	InFlight      int
	MatchedBlocks int
}

// pickRequest is what a scheduler knows of the request being placed.
type pickRequest struct {
	Now          float64
	Prompt       *prompt
	PromptTokens int
	OutputTokens int
	TotalBlocks  int      // full prompt blocks at the engine block size
	Hashes       []uint64 // their hashes (the keys of the pods' KV events); read only
}

// pickFunc is an external placement policy: given the request and every
// candidate endpoint (with load and matched blocks), it returns the index
// into eps of the chosen one. Policies implemented for the daemon plug in
// here through registerPickPolicy and run through the same simulator.
type pickFunc func(req *pickRequest, eps []endpoint) int

// pickPolicies are the registered external policies: name -> constructor
// (seeded, one fresh instance per simulation run).
var pickPolicies = map[string]func(seed uint64) pickFunc{}

// registerPickPolicy makes a policy available to scenario files by name. It
// panics on a duplicate or empty name (a programming error at init time).
func registerPickPolicy(name string, mk func(seed uint64) pickFunc) {
	if name == "" || mk == nil {
		panic("sim: registerPickPolicy needs a name and a constructor")
	}
	if _, dup := pickPolicies[name]; dup {
		panic("sim: pick policy registered twice: " + name)
	}
	if _, dup := builtinProfiles[name]; dup {
		panic("sim: pick policy shadows a built-in profile: " + name)
	}
	pickPolicies[name] = mk
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// scheduler is one placement policy inside the scenario simulator.
type scheduler interface {
	pick(req *pickRequest, eps []endpoint) int
	// routed is told the choice (the approximate prefix scorer learns from it).
	routed(req *pickRequest, pod int)
	// needsIndex: Endpoint.MatchedBlocks must be filled.
	needsIndex() bool
	// onKVEvents receives the pods' KV events (after the event lag) when
	// wantsEvents says so.
	wantsEvents() bool
	onKVEvents(pod int, ops []kvOp, now float64)
}

// noKVEvents is embedded by schedulers that do not listen to the pods.
type noKVEvents struct{}

func (noKVEvents) wantsEvents() bool               { return false }
func (noKVEvents) onKVEvents(int, []kvOp, float64) {}

// newScheduler builds a resolved spec for a fleet of pods.
func newScheduler(spec schedulerSpec, pods, blockSize, kvBlocks int, seed uint64) (scheduler, error) {
	rng := rand.New(rand.NewPCG(seed, 0xd1b54a32d192ed03))
	if spec.Policy != "" {
		return &externalPolicy{fn: pickPolicies[spec.Policy](seed)}, nil
	}
	if spec.Router != "" {
		return newLegacyRouter(spec.Router, pods, blockSize, kvBlocks, seed)
	}
	if spec.Picker == "random" {
		return &randomPicker{rng: rng}, nil
	}
	p := &profile{rng: rng}
	for _, s := range spec.Scorers {
		var sc profileScorer
		switch s.Type {
		case "precise-prefix":
			sc = &precisePrefixScorer{absolute: s.Normalize == "absolute"}
			p.index = true
		case "approx-prefix":
			if pods > 64 {
				return nil, fmt.Errorf("approx-prefix: the simulated indexer holds at most 64 pods")
			}
			sc = newApproxPrefixScorer(pods, s.BlockSizeTokens, s.MaxPrefixBlocks, s.LRUCapacityPerServer)
		case "kv-cache-utilization":
			sc = kvUsageScorer{}
		case "queue":
			sc = queueScorer{}
		}
		p.scorers = append(p.scorers, sc)
		p.weights = append(p.weights, s.Weight)
	}
	return p, nil
}

// newReplicatedScheduler builds replicas independent instances of spec
// (replica k seeded seed+k, so replica 0 is the unreplicated scheduler).
func newReplicatedScheduler(spec schedulerSpec, pods, blockSize, kvBlocks, replicas int, seed uint64) (scheduler, error) {
	if replicas <= 1 {
		return newScheduler(spec, pods, blockSize, kvBlocks, seed)
	}
	r := &replicatedScheduler{}
	for k := 0; k < replicas; k++ {
		s, err := newScheduler(spec, pods, blockSize, kvBlocks, seed+uint64(k))
		if err != nil {
			return nil, err
		}
		r.reps = append(r.reps, s)
	}
	return r, nil
}

// replicatedScheduler is R endpoint-picker replicas of one scheduler behind
// one gateway. Request n (arrival order) is decided by replica n mod R, as
// Envoy opens one ext_proc stream per request and balances the streams over
// the replicas' endpoints; only that replica learns from its decision (GIE
// v0.5.1's PostCycle writes the in-memory index of the replica that ran the
// cycle). What every replica shares: the precise index (each replica
// subscribes to every pod's KV events) and the scraped metrics (one snapshot;
// real replicas each scrape on their own clock).
type replicatedScheduler struct {
	reps  []scheduler
	picks int       // requests picked so far
	cur   scheduler // the replica that made the last pick
}

func (r *replicatedScheduler) pick(req *pickRequest, eps []endpoint) int {
	r.cur = r.reps[r.picks%len(r.reps)]
	r.picks++
	return r.cur.pick(req, eps)
}

func (r *replicatedScheduler) routed(req *pickRequest, pod int) { r.cur.routed(req, pod) }
func (r *replicatedScheduler) needsIndex() bool                 { return r.reps[0].needsIndex() }
func (r *replicatedScheduler) wantsEvents() bool                { return r.reps[0].wantsEvents() }

func (r *replicatedScheduler) onKVEvents(pod int, ops []kvOp, now float64) {
	for _, s := range r.reps {
		s.onKVEvents(pod, ops, now)
	}
}

type externalPolicy struct {
	noKVEvents
	fn pickFunc
}

func (e *externalPolicy) pick(req *pickRequest, eps []endpoint) int { return e.fn(req, eps) }
func (*externalPolicy) routed(*pickRequest, int)                    {}
func (*externalPolicy) needsIndex() bool                            { return true }

// randomPicker is GIE's random-picker: uniform over the candidates.
type randomPicker struct {
	noKVEvents
	rng *rand.Rand
}

func (r *randomPicker) pick(_ *pickRequest, eps []endpoint) int { return r.rng.IntN(len(eps)) }
func (*randomPicker) routed(*pickRequest, int)                  {}
func (*randomPicker) needsIndex() bool                          { return false }

// profileScorer writes one score in [0, 1] per endpoint.
type profileScorer interface {
	score(req *pickRequest, eps []endpoint, out []float64)
}

// profile is an EndpointPickerConfig scheduling profile: the weighted sum of
// its scorers, then the max-score picker, which breaks ties uniformly at
// random (GIE's picker shuffles the candidates before taking the maximum).
type profile struct {
	noKVEvents
	scorers []profileScorer
	weights []float64
	index   bool
	rng     *rand.Rand
	total   []float64
	one     []float64
	ties    []int
}

func (p *profile) needsIndex() bool { return p.index }

func (p *profile) pick(req *pickRequest, eps []endpoint) int {
	n := len(eps)
	p.total = append(p.total[:0], make([]float64, n)...)
	p.one = append(p.one[:0], make([]float64, n)...)
	for i, s := range p.scorers {
		s.score(req, eps, p.one)
		for j := range eps {
			p.total[j] += p.weights[i] * p.one[j]
		}
	}
	best := math.Inf(-1)
	p.ties = p.ties[:0]
	for j, v := range p.total {
		switch {
		case v > best:
			best = v
			p.ties = append(p.ties[:0], j)
		case v == best:
			p.ties = append(p.ties, j)
		}
	}
	if len(p.ties) == 1 {
		return p.ties[0]
	}
	return p.ties[p.rng.IntN(len(p.ties))]
}

func (p *profile) routed(req *pickRequest, pod int) {
	for _, s := range p.scorers {
		if a, ok := s.(*approxPrefixScorer); ok {
			a.record(req, pod)
		}
	}
}

// kvUsageScorer is the kv-cache-utilization scorer: 1 - usage.
type kvUsageScorer struct{}

func (kvUsageScorer) score(_ *pickRequest, eps []endpoint, out []float64) {
	for i, e := range eps {
		out[i] = 1 - e.KVUsage
	}
}

// queueScorer is the queue scorer: waiting requests min-max normalised over
// the candidates, shortest queue 1, longest 0; all equal: 1.
type queueScorer struct{}

func (queueScorer) score(_ *pickRequest, eps []endpoint, out []float64) {
	lo, hi := math.MaxInt, math.MinInt
	for _, e := range eps {
		lo, hi = min(lo, e.Waiting), max(hi, e.Waiting)
	}
	for i, e := range eps {
		if hi == lo {
			out[i] = 1
		} else {
			out[i] = float64(hi-e.Waiting) / float64(hi-lo)
		}
	}
}

// precisePrefixScorer scores from the precise index's matched blocks. minmax
// (the llm-d scorer of the published runs): pods with no match get 0; among
// pods with a match, (m - min) / (max - min), or 1 when all matches are
// equal. absolute: matched / total blocks.
type precisePrefixScorer struct{ absolute bool }

func (s *precisePrefixScorer) score(req *pickRequest, eps []endpoint, out []float64) {
	if s.absolute {
		for i, e := range eps {
			out[i] = 0
			if req.TotalBlocks > 0 {
				out[i] = min(1, float64(e.MatchedBlocks)/float64(req.TotalBlocks))
			}
		}
		return
	}
	lo, hi := math.MaxInt, 0
	for _, e := range eps {
		if e.MatchedBlocks > 0 {
			lo, hi = min(lo, e.MatchedBlocks), max(hi, e.MatchedBlocks)
		}
	}
	for i, e := range eps {
		switch {
		case e.MatchedBlocks == 0:
			out[i] = 0
		case hi == lo:
			out[i] = 1
		default:
			out[i] = float64(e.MatchedBlocks-lo) / float64(hi-lo)
		}
	}
}

// approxPrefixScorer is GIE v0.5.1's prefix-cache-scorer
// (pkg/epp/scheduling/framework/plugins/multi/prefix, docs/simulator.md has
// the line of each rule): a router-side index built only from its own
// routing decisions. The prompt is the model's hash followed by blocks of
// the scorer's own size (at most MaxBlocks); routing a request to a server
// records all its hashes in that server's LRU (LRUCapacity entries); a
// server's match is the number of hashes it holds, walking from the first
// and stopping at the first hash no server holds; the score is match /
// hashes. Nothing the pods do (evictions, preemptions) ever reaches it.
type approxPrefixScorer struct {
	blockSize, maxBlocks int
	lrus                 []*cache.LRU
	holders              map[uint64]uint64 // block -> bitset of servers holding it
	hashes               map[int][]uint64  // prompt ID -> its blocks at this block size (bounded by the workload's prompts)
	scratch              []uint64
	counts               []int
}

func newApproxPrefixScorer(pods, blockSize, maxBlocks, capacity int) *approxPrefixScorer {
	a := &approxPrefixScorer{blockSize: blockSize, maxBlocks: maxBlocks, holders: make(map[uint64]uint64),
		hashes: make(map[int][]uint64), counts: make([]int, pods)}
	for i := 0; i < pods; i++ {
		a.lrus = append(a.lrus, cache.NewLRU(capacity))
	}
	return a
}

// approxModelBlock is GIE's hash 0: the target model's name, which every
// prompt of a scenario shares (one model per scenario).
const approxModelBlock = 0x6d6f64656c000000

// blocks is GIE's hashPrompt: nothing for a prompt shorter than one block;
// else the model's hash followed by the prompt's first maxBlocks full
// blocks (a trailing partial block is ignored).
func (a *approxPrefixScorer) blocks(p *prompt) []uint64 {
	h, ok := a.hashes[p.ID]
	if !ok {
		if content := p.hashes(a.blockSize, a.maxBlocks); len(content) > 0 {
			h = append([]uint64{approxModelBlock}, content...)
		}
		a.hashes[p.ID] = h
	}
	return h
}

func (a *approxPrefixScorer) score(req *pickRequest, eps []endpoint, out []float64) {
	hs := a.blocks(req.Prompt)
	clear(a.counts)
	for _, h := range hs {
		set := a.holders[h]
		if set == 0 {
			break
		}
		for p := range a.counts {
			if set&(1<<p) != 0 {
				a.counts[p]++
			}
		}
	}
	for i, e := range eps {
		out[i] = 0
		if len(hs) > 0 {
			out[i] = float64(a.counts[e.Pod]) / float64(len(hs))
		}
	}
}

func (a *approxPrefixScorer) record(req *pickRequest, pod int) {
	for _, h := range a.blocks(req.Prompt) {
		a.scratch = a.lrus[pod].Access(h, a.scratch[:0])
		for _, ev := range a.scratch {
			if s := a.holders[ev] &^ (1 << pod); s == 0 {
				delete(a.holders, ev)
			} else {
				a.holders[ev] = s
			}
		}
		a.holders[h] |= 1 << pod
	}
}

// legacyRouter runs one of the trace simulator's routing policies
// (random, least-loaded, chwbl, approx-prefix, aibrix, sglang, precise,
// precise+spec, ...) inside the scenario simulator with their default
// parameters: their load is the scheduler's own in-flight count, their
// requests carry the engine block hashes, and they receive the pods' KV
// events.
type legacyRouter struct {
	router router
	req    Request
	view   view
}

func newLegacyRouter(name string, pods, blockSize, kvBlocks int, seed uint64) (*legacyRouter, error) {
	p := DefaultRouterParams(pods, blockSize, kvBlocks)
	p.Seed = seed
	r, err := newRouter(name, p)
	if err != nil {
		return nil, err
	}
	return &legacyRouter{router: r, view: view{Load: make([]int, pods), BlockSize: blockSize}}, nil
}

func (l *legacyRouter) pick(req *pickRequest, eps []endpoint) int {
	l.req = Request{InputLength: req.PromptTokens, OutputLength: req.OutputTokens, HashIDs: req.Hashes}
	l.view.Now = req.Now
	for i, e := range eps {
		l.view.Load[i] = e.InFlight
	}
	return l.router.route(&l.req, &l.view)
}

func (*legacyRouter) routed(*pickRequest, int) {}
func (*legacyRouter) needsIndex() bool         { return false }
func (*legacyRouter) wantsEvents() bool        { return true }
func (l *legacyRouter) onKVEvents(pod int, ops []kvOp, now float64) {
	l.router.onKVEvents(pod, ops, now)
}
