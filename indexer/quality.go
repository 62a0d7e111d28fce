package indexer

import (
	"log/slog"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// Decision quality: what each pick found and chose, per model, so an
// operator sees whether routing pays off and when a model needs more
// engines. Three signals:
//
//   - the share of the request's blocks the chosen pod held at pick time;
//   - affinity pressure (LocalAI's forced-disturb signal): some candidate
//     held a usable prefix (the policy did not call it too short), yet the
//     policy chose a pod holding less of it because of load. The warm pods
//     are saturated: more engines of the model would serve those requests
//     from cache;
//   - cold picks: the chosen pod held nothing of the request while another
//     candidate held some of it.
//
// Model labels are bounded the way every per-model series of the daemon
// is: a model is named only once the interner knows it (an engine
// published for it, bounded by --max-models); picks for any other model
// name share the label OtherModel, so a client cannot grow the series.

// OtherModel labels the picks of models no engine has published for.
const OtherModel = "_other"

// Quality bounds and windows. The picks awaiting feedback are bounded by
// PickConfig.FeedbackCapacity and FeedbackTTL (rows of Options: a router
// with more picks in flight than the default, or slower engines, raises
// them); the rest are constants: the per-pod table is as large as the
// per-pod series the daemon exports, and the drift alarm's window and
// thresholds are what the metrics' help states.
const (
	// qualityStep and qualitySteps are the history kept per model for the
	// status page: 60 steps of 10 s.
	qualityStep  = 10 * time.Second
	qualitySteps = 60
	// MaxQualityPods bounds the (model, pod) pairs with quality and
	// feedback series; pairs beyond it are counted, not kept.
	MaxQualityPods = MaxPodSeries
	// feedbackWindow is the recent feedback per (model, pod) the drift
	// alarm reads; the alarm needs feedbackMinSamples of them and is raised
	// when at least half disagree, cleared when fewer than a quarter do.
	feedbackWindow     = 64
	feedbackMinSamples = 16
)

// QualityStepDuration is the length of one step of ModelQuality.History.
const QualityStepDuration = qualityStep

// shareBounds are the upper bounds of the cached-share histogram.
var shareBounds = []float64{0, 0.1, 0.25, 0.5, 0.75, 0.9, 1}

// QualityStep is one step of a model's pick history.
type QualityStep struct {
	// Start is the step's start, Unix seconds.
	Start int64
	// Picks in the step, their requests' full blocks, and of those the
	// blocks the chosen pods held.
	Picks, PromptBlocks, CachedBlocks uint64
	// Pressure and Cold count the step's affinity-pressure and cold picks.
	Pressure, Cold uint64
}

type modelQuality struct {
	name string
	// picks with at least one full block; of them, those where some
	// candidate held a prefix
	picks, prefixHeld uint64
	pressure, cold    uint64
	promptBlocks      uint64
	cachedBlocks      uint64
	// cached blocks of the chosen pods by tier (indexed blocks only)
	tierBlocks [event.NumTiers]uint64
	// share observes each pick's cached share (a child of shareVec)
	share prometheus.Observer
	// feedback whose prompt length differs from the one the pick hashed
	promptMismatch uint64
	steps          [qualitySteps]QualityStep // ring, by Start/qualityStep
	pods           map[string]*podQuality
}

// podQuality is one (model, pod): its picks and its engine's feedback.
type podQuality struct {
	picks, cachedBlocks uint64
	tierBlocks          [event.NumTiers]uint64
	fb                  feedbackStats
}

type feedbackStats struct {
	n, predicted, reported, absErr, over, under uint64
	// the recent window: whether each feedback disagreed
	window [feedbackWindow]bool
	wn, wi int
	wBad   int
	alarm  bool
	// last disagreement, for the alarm's message
	lastPredicted, lastReported int
}

type pendingPick struct {
	model       *modelQuality
	pod         *podQuality // nil when the pod table was full
	podName     string
	matched     int32
	blockSize   int32
	totalBlocks int32
	prompt      int32 // tokens; 0 = unknown (block_hashes input)
	deadline    int64
}

// pendingSlot is one slot of the ring of picks awaiting feedback: pick id
// i lives in slot i % capacity until a later id takes it.
type pendingSlot struct {
	pendingPick
	id   uint64
	live bool
}

// feedbackPage is the ring's unit of allocation: a page is allocated the
// first time an id falls in it and kept, so a steady stream of picks
// allocates nothing and an idle daemon holds one page.
const feedbackPage = 1024

// quality holds the per-model counts and the picks awaiting feedback.
type quality struct {
	in  *kvindex.Interner
	now func() time.Time
	log *slog.Logger

	// shareVec is kvindexd_pick_cached_share; each model resolves its
	// child once.
	shareVec *prometheus.HistogramVec

	mu          sync.Mutex
	models      map[kvindex.ModelID]*modelQuality
	other       *modelQuality
	nPods       int
	podsOmitted uint64 // picks and feedback of pairs beyond MaxQualityPods

	ttl      int64
	capacity uint64 // pending picks at most (PickConfig.FeedbackCapacity)
	// ids oldest..nextID were issued; those still live await feedback.
	// The ring's capacity slots are split in pages of feedbackPage.
	pages    []*[feedbackPage]pendingSlot
	oldest   uint64
	nextID   uint64
	live     int
	evicted  uint64 // pending picks dropped at capacity
	expired  uint64 // pending picks whose TTL passed without feedback
	rejected [numFeedbackRejects]uint64
}

type feedbackReject uint8

const (
	rejectInvalid feedbackReject = iota
	rejectUnknown
	numFeedbackRejects
)

var rejectNames = [numFeedbackRejects]string{"invalid", "unknown_pick"}

// newQuality holds at most capacity picks awaiting feedback, each for ttl
// (both in range: PickConfig's defaults are resolved by the caller).
func newQuality(in *kvindex.Interner, now func() time.Time, log *slog.Logger, capacity int, ttl time.Duration) *quality {
	shareVec := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvindexd_pick_cached_share",
		Help:    "Share of a pick's full blocks the chosen pod held at pick time (picks with at least one full block).",
		Buckets: shareBounds,
	}, modelLabel)
	q := &quality{in: in, now: now, log: log, models: map[kvindex.ModelID]*modelQuality{}, shareVec: shareVec,
		other: &modelQuality{name: OtherModel, pods: map[string]*podQuality{}, share: shareVec.WithLabelValues(OtherModel)},
		// a random start: a restarted daemon does not accept its
		// predecessor's pick ids as its own
		ttl: int64(ttl), capacity: uint64(capacity), pages: make([]*[feedbackPage]pendingSlot, (capacity+feedbackPage-1)/feedbackPage),
		nextID: rand.Uint64()}
	q.oldest = q.nextID + 1
	return q
}

// slot returns pick id's slot, allocating its page when alloc.
func (q *quality) slot(id uint64, alloc bool) *pendingSlot {
	i := id % q.capacity
	p := q.pages[i/feedbackPage]
	if p == nil {
		if !alloc {
			return nil
		}
		p = new([feedbackPage]pendingSlot)
		q.pages[i/feedbackPage] = p
	}
	return &p[i%feedbackPage]
}

func (q *quality) model(id kvindex.ModelID, known bool) *modelQuality {
	if !known {
		return q.other
	}
	m := q.models[id]
	if m == nil {
		name := q.in.ModelName(id)
		m = &modelQuality{name: name, pods: map[string]*podQuality{}, share: q.shareVec.WithLabelValues(name)}
		q.models[id] = m
	}
	return m
}

func (q *quality) pod(m *modelQuality, name string) *podQuality {
	p := m.pods[name]
	if p == nil {
		if q.nPods >= MaxQualityPods {
			q.podsOmitted++
			return nil
		}
		p = &podQuality{}
		m.pods[name] = p
		q.nPods++
	}
	return p
}

// observe records one pick: r is answered, policyChosen is the policy's
// choice before a session tie-break, tokens the prompt length (0 =
// unknown). It returns the pick's id for feedback.
func (q *quality) observe(model kvindex.ModelID, known bool, r *PickResult, policyChosen int, tokens int) uint64 {
	ch := &r.Candidates[r.Chosen]
	bestCached, othersHold := 0.0, false
	for i := range r.Candidates {
		if r.PD && !r.roles[i].Decodes() {
			continue // a P/D pick compares the pods that could decode it
		}
		c := &r.Candidates[i]
		bestCached = math.Max(bestCached, c.Cached)
		othersHold = othersHold || (i != r.Chosen && c.MatchedBlocks > 0)
	}
	// the policy (not a session tie) chose a pod caching less than the
	// best, and it did not call the best prefix too short: load decided
	pressure := bestCached > 0 && ch.Cached < bestCached && policyChosen == r.Chosen && r.Reason != routing.ReasonNoMatch
	cold := ch.MatchedBlocks == 0 && othersHold
	now := q.now().UnixNano()

	q.mu.Lock()
	defer q.mu.Unlock()
	m := q.model(model, known)
	st := m.step(now)
	st.Picks++
	if r.TotalBlocks > 0 {
		m.picks++
		m.promptBlocks += uint64(r.TotalBlocks)
		m.cachedBlocks += uint64(ch.MatchedBlocks)
		m.share.Observe(float64(ch.MatchedBlocks) / float64(r.TotalBlocks))
		st.PromptBlocks += uint64(r.TotalBlocks)
		st.CachedBlocks += uint64(ch.MatchedBlocks)
	}
	if bestCached > 0 {
		m.prefixHeld++
	}
	if pressure {
		m.pressure++
		st.Pressure++
	}
	if cold {
		m.cold++
		st.Cold++
	}
	for t, n := range ch.Tiers {
		m.tierBlocks[t] += uint64(n)
	}
	p := q.pod(m, ch.Pod)
	if p != nil {
		p.picks++
		p.cachedBlocks += uint64(ch.MatchedBlocks)
		for t, n := range ch.Tiers {
			p.tierBlocks[t] += uint64(n)
		}
	}
	return q.hold(now, pendingPick{model: m, pod: p, podName: ch.Pod, matched: int32(ch.MatchedBlocks),
		blockSize: int32(r.BlockSize), totalBlocks: int32(r.TotalBlocks), prompt: int32(min(tokens, math.MaxInt32))})
}

// step returns the history step now falls in, starting it when new.
func (m *modelQuality) step(now int64) *QualityStep {
	start := now / int64(qualityStep) * int64(qualityStep)
	st := &m.steps[(start/int64(qualityStep))%qualitySteps]
	if st.Start != start/1e9 {
		*st = QualityStep{Start: start / 1e9}
	}
	return st
}

// hold remembers a pick for its feedback and returns its id; q.mu is held.
func (q *quality) hold(now int64, p pendingPick) uint64 {
	q.expire(now)
	q.nextID++
	if q.nextID == 0 { // 0 is "no pick id"
		q.nextID++
	}
	sl := q.slot(q.nextID, true)
	if sl.live { // the ring is full: the oldest pick gives way
		q.evicted++
		q.live--
	}
	p.deadline = now + q.ttl
	*sl = pendingSlot{pendingPick: p, id: q.nextID, live: true}
	q.live++
	if q.nextID-q.oldest >= q.capacity {
		q.oldest = q.nextID - q.capacity + 1
	}
	return q.nextID
}

// expire drops the pending picks whose TTL passed, oldest first (ids are
// issued in deadline order); q.mu is held.
func (q *quality) expire(now int64) {
	for q.live > 0 && q.oldest-1 != q.nextID {
		sl := q.slot(q.oldest, false)
		if sl != nil && sl.id == q.oldest && sl.live {
			if sl.deadline > now {
				return
			}
			sl.live = false
			q.live--
			q.expired++
		}
		q.oldest++
	}
}

// take returns pick id's pending pick and forgets it; q.mu is held.
func (q *quality) take(id uint64) (pendingPick, bool) {
	sl := q.slot(id, false)
	if sl == nil || sl.id != id || !sl.live {
		return pendingPick{}, false
	}
	sl.live = false
	q.live--
	return sl.pendingPick, true
}

// Feedback is what a router hands back once the engine answered a picked
// request: the engine's own count of prompt tokens it did not compute
// (vLLM: usage.prompt_tokens_details.cached_tokens; SGLang:
// meta_info.cached_tokens).
type Feedback struct {
	// PickID is the Pick answer's PickID.
	PickID uint64
	// CachedTokens is the engine's reported cached prompt tokens.
	CachedTokens int
	// PromptTokens is the engine's prompt length (usage.prompt_tokens);
	// 0 = not given. It is needed for picks by block hashes (the daemon
	// did not see the tokens), and otherwise checked against the length
	// the pick hashed.
	PromptTokens int
}

// FeedbackResult is the comparison one feedback made.
type FeedbackResult struct {
	Model, Pod string
	// PredictedTokens is what the engine should report if the index was
	// right: the chosen pod's matched blocks in tokens, under the engine's
	// rule that at least the prompt's last token is computed and hits are
	// whole blocks.
	PredictedTokens int
	ReportedTokens  int
	// Disagrees: the two differ by a block or more.
	Disagrees bool
}

// EngineCachedTokens is how many prompt tokens an engine reports as cached
// when it holds matched leading blocks of blockSize tokens of a prompt of
// promptTokens tokens. vLLM (v1 KVCacheManager.get_computed_blocks) caps
// a prefix hit at prompt length - 1 (the last token is recomputed for its
// logits) and counts whole blocks only, so a fully cached prompt reports
// its last full block below that cap; SGLang caps its radix match at the
// same prompt length - 1, in pages. promptTokens <= 0: unknown, no cap.
func EngineCachedTokens(matched, blockSize, promptTokens int) int {
	hit := matched * blockSize
	if promptTokens > 0 && blockSize > 0 {
		hit = min(hit, (promptTokens-1)/blockSize*blockSize)
	}
	return max(hit, 0)
}

// Feedback compares an engine's reported cached tokens with what the pick
// predicted for the pod it chose. A pick is answered once: a second
// feedback, one after PickConfig.FeedbackTTL or one for a pick evicted at
// PickConfig.FeedbackCapacity is
// NotFound.
func (ix *Indexer) Feedback(f Feedback) (FeedbackResult, error) {
	res, err := ix.quality.feedback(f)
	if err != nil {
		return FeedbackResult{}, err
	}
	return res, nil
}

// RejectFeedback counts a feedback call refused before it reached
// Feedback (a transport's parse error) with the invalid ones.
func (ix *Indexer) RejectFeedback() {
	ix.quality.mu.Lock()
	ix.quality.rejected[rejectInvalid]++
	ix.quality.mu.Unlock()
}

func (q *quality) feedback(f Feedback) (FeedbackResult, *Error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case f.PickID == 0:
		q.rejected[rejectInvalid]++
		return FeedbackResult{}, errorf(InvalidArgument, "pick_id is required: the id of the Pick answer")
	case f.CachedTokens < 0 || f.PromptTokens < 0:
		q.rejected[rejectInvalid]++
		return FeedbackResult{}, errorf(InvalidArgument, "cached_tokens and prompt_tokens must be >= 0")
	case f.PromptTokens > 0 && f.CachedTokens > f.PromptTokens:
		q.rejected[rejectInvalid]++
		return FeedbackResult{}, errorf(InvalidArgument, "cached_tokens %d exceeds prompt_tokens %d", f.CachedTokens, f.PromptTokens)
	case f.CachedTokens > MaxInputLen:
		q.rejected[rejectInvalid]++
		return FeedbackResult{}, errorf(InvalidArgument, "cached_tokens %d exceeds the longest input, %d", f.CachedTokens, MaxInputLen)
	}
	q.expire(q.now().UnixNano())
	p, ok := q.take(f.PickID)
	if !ok {
		q.rejected[rejectUnknown]++
		return FeedbackResult{}, errorf(NotFound, "pick_id %016x is not awaiting feedback: answered already, older than %v, "+
			"dropped at the capacity of %d, or issued by another daemon", f.PickID, time.Duration(q.ttl), q.capacity)
	}
	prompt := int(p.prompt)
	if prompt > 0 && f.PromptTokens > 0 && f.PromptTokens != prompt {
		// the engine's prompt is not the one hashed: a chat template or
		// tokenizer differs (its cached tokens are still compared)
		p.model.promptMismatch++
	}
	if prompt == 0 {
		prompt = f.PromptTokens
	}
	pred := EngineCachedTokens(int(p.matched), int(p.blockSize), prompt)
	res := FeedbackResult{Model: p.model.name, Pod: p.podName, PredictedTokens: pred, ReportedTokens: f.CachedTokens}
	diff := pred - f.CachedTokens
	res.Disagrees = diff >= int(p.blockSize) || -diff >= int(p.blockSize)
	if p.pod == nil {
		q.podsOmitted++
		return res, nil
	}
	s := &p.pod.fb
	s.n++
	s.predicted += uint64(pred)
	s.reported += uint64(f.CachedTokens)
	if diff > 0 {
		s.absErr += uint64(diff)
		s.over += uint64(diff)
	} else {
		s.absErr += uint64(-diff)
		s.under += uint64(-diff)
	}
	if s.wn == feedbackWindow && s.window[s.wi] {
		s.wBad--
	}
	s.window[s.wi] = res.Disagrees
	s.wi = (s.wi + 1) % feedbackWindow
	s.wn = min(s.wn+1, feedbackWindow)
	if res.Disagrees {
		s.wBad++
		s.lastPredicted, s.lastReported = pred, f.CachedTokens
	}
	switch {
	case !s.alarm && s.wn >= feedbackMinSamples && 2*s.wBad >= s.wn:
		s.alarm = true
		q.log.Warn("pick feedback drift: the engine reports other cached tokens than the index predicted for the pods it picked",
			"model", p.model.name, "pod", p.podName, "disagreeing", s.wBad, "of", s.wn,
			"last_predicted_tokens", s.lastPredicted, "last_reported_tokens", s.lastReported, "hint", feedbackHint)
	case s.alarm && 4*s.wBad < s.wn:
		s.alarm = false
		q.log.Info("pick feedback drift cleared", "model", p.model.name, "pod", p.podName, "disagreeing", s.wBad, "of", s.wn)
	}
	return res, nil
}

// feedbackHint names the usual causes of a drift alarm.
const feedbackHint = "the index's view of this pod is wrong: events lost or late (check /v1/pods for gaps and parity), " +
	"the pod's cache evicts faster than its events say, the engine's block size or prefix caching differs, " +
	"or the router sends picked requests to another pod"

// PodQuality is one pod of a model's quality view.
type PodQuality struct {
	Pod string
	// Picks that chose the pod and the blocks it held for them, by tier
	// (indexed blocks; speculative and history matches have no tier).
	Picks, CachedBlocks uint64
	TierBlocks          [event.NumTiers]uint64
	// Feedback from the pod's engine: count, predicted and reported
	// cached tokens, and the recent window's disagreeing share.
	Feedback                        uint64
	PredictedTokens, ReportedTokens uint64
	AbsErrorTokens                  uint64
	Drift                           float64
	Alarm                           bool
	Hint                            string
	// LastPredictedTokens and LastReportedTokens are the last
	// disagreement's numbers.
	LastPredictedTokens, LastReportedTokens int
}

// ModelQuality is one model's decision quality.
type ModelQuality struct {
	Model string
	// Picks (with at least one full block), of them those where some
	// candidate held a prefix, affinity-pressure and cold picks.
	Picks, PrefixHeld, Pressure, Cold uint64
	// PromptBlocks and CachedBlocks: the picks' blocks and those the chosen
	// pods held; CachedShare is their ratio.
	PromptBlocks, CachedBlocks uint64
	CachedShare                float64
	TierBlocks                 [event.NumTiers]uint64
	PromptMismatches           uint64
	// History is the last qualitySteps steps, oldest first, ending with the
	// current one (steps without picks included).
	History []QualityStep
	Pods    []PodQuality
}

// Quality lists every model's decision quality, sorted by name (OtherModel
// included once it has picks).
func (ix *Indexer) Quality() []ModelQuality { return ix.quality.snapshot() }

func (q *quality) snapshot() []ModelQuality {
	now := q.now().UnixNano()
	cur := now / int64(qualityStep) * int64(qualityStep) / 1e9
	step := int64(qualityStep / time.Second)
	q.mu.Lock()
	defer q.mu.Unlock()
	ms := make([]*modelQuality, 0, len(q.models)+1)
	for _, m := range q.models {
		ms = append(ms, m)
	}
	if q.other.picks > 0 || len(q.other.pods) > 0 {
		ms = append(ms, q.other)
	}
	out := make([]ModelQuality, 0, len(ms))
	for _, m := range ms {
		mq := ModelQuality{Model: m.name, Picks: m.picks, PrefixHeld: m.prefixHeld, Pressure: m.pressure, Cold: m.cold,
			PromptBlocks: m.promptBlocks, CachedBlocks: m.cachedBlocks, TierBlocks: m.tierBlocks, PromptMismatches: m.promptMismatch,
			History: make([]QualityStep, qualitySteps)}
		if m.promptBlocks > 0 {
			mq.CachedShare = float64(m.cachedBlocks) / float64(m.promptBlocks)
		}
		for i := range qualitySteps {
			start := cur - int64(qualitySteps-1-i)*step
			st := m.steps[(start/step)%qualitySteps]
			if st.Start != start {
				st = QualityStep{Start: start}
			}
			mq.History[i] = st
		}
		for name, p := range m.pods {
			pq := PodQuality{Pod: name, Picks: p.picks, CachedBlocks: p.cachedBlocks, TierBlocks: p.tierBlocks,
				Feedback: p.fb.n, PredictedTokens: p.fb.predicted, ReportedTokens: p.fb.reported, AbsErrorTokens: p.fb.absErr,
				Alarm: p.fb.alarm, LastPredictedTokens: p.fb.lastPredicted, LastReportedTokens: p.fb.lastReported}
			if p.fb.wn > 0 {
				pq.Drift = float64(p.fb.wBad) / float64(p.fb.wn)
			}
			if pq.Alarm {
				pq.Hint = feedbackHint
			}
			mq.Pods = append(mq.Pods, pq)
		}
		sort.Slice(mq.Pods, func(i, j int) bool { return mq.Pods[i].Pod < mq.Pods[j].Pod })
		out = append(out, mq)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

var (
	modelLabel            = []string{"model"}
	modelPodLabels        = []string{"model", "pod"}
	descPickPromptBlocks  = prometheus.NewDesc("kvindexd_pick_prompt_blocks_total", "Full blocks of picked requests.", modelLabel, nil)
	descPickCachedBlocks  = prometheus.NewDesc("kvindexd_pick_cached_blocks_total", "Full blocks of picked requests the chosen pod held at pick time (indexed, speculative or from the routing history).", modelLabel, nil)
	descPickPrefixHeld    = prometheus.NewDesc("kvindexd_pick_prefix_held_total", "Picks where some candidate held a prefix of the request.", modelLabel, nil)
	descPickPressure      = prometheus.NewDesc("kvindexd_pick_affinity_pressure_total", "Picks where the policy passed over the pod caching the most of the request because of load (LocalAI's forced-disturb signal): the model's warm engines are saturated.", modelLabel, nil)
	descPickCold          = prometheus.NewDesc("kvindexd_pick_cold_total", "Picks that chose a pod holding none of the request while another candidate held some of it.", modelLabel, nil)
	descPickTierBlocks    = prometheus.NewDesc("kvindexd_pick_cached_tier_blocks_total", "Indexed blocks the chosen pods held at pick time, by tier.", []string{"model", "tier"}, nil)
	descPickPodPicks      = prometheus.NewDesc("kvindexd_pick_pod_picks_total", "Picks that chose the pod.", modelPodLabels, nil)
	descQualityOmitted    = prometheus.NewDesc("kvindexd_pick_quality_pods_omitted_total", "Picks and feedback of (model, pod) pairs beyond the first MaxQualityPods, counted only in the per-model series.", nil, nil)
	descFeedback          = prometheus.NewDesc("kvindexd_feedback_total", "Engine feedback on picks (reported cached tokens) per model and chosen pod.", modelPodLabels, nil)
	descFeedbackPredicted = prometheus.NewDesc("kvindexd_feedback_predicted_tokens_total", "Cached prompt tokens the index predicted for the chosen pod, under the engine's rules (whole blocks, the last prompt token recomputed).", modelPodLabels, nil)
	descFeedbackReported  = prometheus.NewDesc("kvindexd_feedback_reported_tokens_total", "Cached prompt tokens the engine reported for picked requests.", modelPodLabels, nil)
	descFeedbackAbsError  = prometheus.NewDesc("kvindexd_feedback_error_tokens_total", "Sum of |predicted - reported| cached tokens.", modelPodLabels, nil)
	descFeedbackDrift     = prometheus.NewDesc("kvindexd_feedback_drift", "Share of the pod's last 64 feedbacks whose prediction was off by a block or more.", modelPodLabels, nil)
	descFeedbackAlarm     = prometheus.NewDesc("kvindexd_feedback_alarm", "1 while the pod's engine disagrees with the index (half of the recent feedback off by a block or more; cleared below a quarter).", modelPodLabels, nil)
	descFeedbackMismatch  = prometheus.NewDesc("kvindexd_feedback_prompt_mismatches_total", "Feedback whose engine prompt length differs from the tokens the pick hashed (chat template or tokenizer differ).", modelLabel, nil)
	descFeedbackPending   = prometheus.NewDesc("kvindexd_feedback_pending", "Picks awaiting feedback (bounded by --feedback-capacity).", nil, nil)
	descFeedbackEvicted   = prometheus.NewDesc("kvindexd_feedback_evicted_total", "Picks dropped from the feedback table at its capacity before their TTL.", nil, nil)
	descFeedbackExpired   = prometheus.NewDesc("kvindexd_feedback_expired_total", "Picks whose feedback did not arrive within --feedback-ttl.", nil, nil)
	descFeedbackRejected  = prometheus.NewDesc("kvindexd_feedback_rejected_total", "Feedback calls refused: invalid (bad numbers) or unknown_pick (answered, expired, evicted or foreign id).", []string{"reason"}, nil)
)

// qualityCollector reads the quality counts at scrape time.
type qualityCollector struct{ q *quality }

func (c qualityCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPickPromptBlocks, descPickCachedBlocks, descPickPrefixHeld, descPickPressure,
		descPickCold, descPickTierBlocks, descPickPodPicks, descQualityOmitted, descFeedback, descFeedbackPredicted, descFeedbackReported,
		descFeedbackAbsError, descFeedbackDrift, descFeedbackAlarm, descFeedbackMismatch, descFeedbackPending, descFeedbackEvicted,
		descFeedbackExpired, descFeedbackRejected} {
		ch <- d
	}
}

func (c qualityCollector) Collect(ch chan<- prometheus.Metric) {
	q := c.q
	q.mu.Lock()
	q.expire(q.now().UnixNano())
	pending, evicted, expired, rejected, omitted := q.live, q.evicted, q.expired, q.rejected, q.podsOmitted
	q.mu.Unlock()
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	for _, m := range q.snapshot() {
		counter(descPickPromptBlocks, m.PromptBlocks, m.Model)
		counter(descPickCachedBlocks, m.CachedBlocks, m.Model)
		counter(descPickPrefixHeld, m.PrefixHeld, m.Model)
		counter(descPickPressure, m.Pressure, m.Model)
		counter(descPickCold, m.Cold, m.Model)
		counter(descFeedbackMismatch, m.PromptMismatches, m.Model)
		for t, n := range m.TierBlocks {
			counter(descPickTierBlocks, n, m.Model, event.Tier(t).String())
		}
		for _, p := range m.Pods {
			counter(descPickPodPicks, p.Picks, m.Model, p.Pod)
			if p.Feedback == 0 {
				continue
			}
			counter(descFeedback, p.Feedback, m.Model, p.Pod)
			counter(descFeedbackPredicted, p.PredictedTokens, m.Model, p.Pod)
			counter(descFeedbackReported, p.ReportedTokens, m.Model, p.Pod)
			counter(descFeedbackAbsError, p.AbsErrorTokens, m.Model, p.Pod)
			ch <- prometheus.MustNewConstMetric(descFeedbackDrift, prometheus.GaugeValue, p.Drift, m.Model, p.Pod)
			alarm := 0.0
			if p.Alarm {
				alarm = 1
			}
			ch <- prometheus.MustNewConstMetric(descFeedbackAlarm, prometheus.GaugeValue, alarm, m.Model, p.Pod)
		}
	}
	counter(descQualityOmitted, omitted)
	ch <- prometheus.MustNewConstMetric(descFeedbackPending, prometheus.GaugeValue, float64(pending))
	counter(descFeedbackEvicted, evicted)
	counter(descFeedbackExpired, expired)
	for r, n := range rejected {
		counter(descFeedbackRejected, n, rejectNames[r])
	}
}
