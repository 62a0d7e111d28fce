package kvevents

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/prometheus/client_golang/prometheus"
)

// Limits on what publishers can make the subscriber hold. Config fields
// override the defaults; the name lengths and the per-message element cap are
// fixed.
const (
	// DefaultMaxStreams bounds the (pod, dp rank) streams tracked at once.
	DefaultMaxStreams = 10000
	// DefaultMaxModels bounds the distinct model names of those streams.
	DefaultMaxModels = 1000
	// DefaultMaxDPRanks bounds data-parallel ranks: rank < 64.
	DefaultMaxDPRanks = 64
	// DefaultPodExpiry: a stream silent this long is cleared and forgotten.
	DefaultPodExpiry = time.Hour
	// DefaultQueueBytes bounds the decoded batches waiting in all worker
	// queues together (an estimate of their memory).
	DefaultQueueBytes = 256 << 20
	// MaxPodNameBytes bounds a pod name (a DNS name's length).
	MaxPodNameBytes = 253
	// MaxModelNameBytes bounds a model name (Hugging Face ids and paths).
	MaxModelNameBytes = 256
	// MaxElementsPerMessage bounds the array elements (events, block hashes,
	// token ids, extra keys) one payload may declare: a decoded batch is at
	// most ~32 MiB, whatever the message size. vLLM's largest batches (a
	// long prefill stored in one step) are ~100x below it.
	MaxElementsPerMessage = 1 << 22
	// restartLowSeq: a sequence number going back below this (or below
	// half the last one) is an engine restart; see seqVerdict.
	restartLowSeq = 16
)

// checkName says why name cannot become a pod or model name ("" = it can).
// Names end up as Prometheus label values and JSON strings, which must be
// valid UTF-8: invalid names are dropped (and counted), not escaped, so two
// different byte strings never become the same pod.
func checkName(name []byte, maxLen int) string {
	if len(name) > maxLen {
		return "too_long"
	}
	if !utf8.Valid(name) {
		return "invalid_utf8"
	}
	for _, r := range string(name) {
		if r < 0x20 || (r >= 0x7f && r < 0xa0) {
			return "control_char"
		}
	}
	return ""
}

// NameProblem is checkName for a name that did not come from an event (a
// snapshot file): "" when name can be a pod or model name of at most maxLen
// bytes, else the reason (too_long, invalid_utf8, control_char).
func NameProblem(name string, maxLen int) string { return checkName([]byte(name), maxLen) }

// printable shortens a rejected name for a log line.
func printable(name []byte) string {
	if len(name) > 64 {
		name = name[:64]
	}
	return string(name) // slog quotes and escapes it
}

// seqVerdict says what a sequence number that does not follow last means.
// vLLM and SGLang number a publisher's batches 0, 1, 2, ... from process
// start, so a restarted engine starts again near 0: a backward jump to a low
// value (below restartLowSeq or half of last) is a restart and clears the
// pod. An equal number is the same batch again (a duplicate), and a backward
// jump that stays high is a batch from the past (two publishers on one
// topic, a replayed message): both are dropped and counted, never a clear.
func seqVerdict(last, seq uint64) string {
	switch {
	case seq == last:
		return "duplicate_seq"
	case seq < last && seq >= restartLowSeq && seq > last/2:
		return "stale_seq"
	}
	return ""
}

// limitMetrics are the series of the limits.
type limitMetrics struct {
	streams, models prometheus.GaugeFunc
	expired         prometheus.Counter
	logSuppressed   prometheus.Counter
	queuedBytes     prometheus.GaugeFunc
	applyLag        prometheus.GaugeFunc
	rebuildsQueued  prometheus.GaugeFunc
	activeStreams   prometheus.GaugeFunc
	applyStall      prometheus.GaugeFunc
	sharedViews     prometheus.GaugeFunc
}

// limits is the Subscriber's bookkeeping for Config's caps; its maps are
// guarded by Subscriber.mu.
type limits struct {
	models  map[string]int       // streams per model name
	modelOf map[streamKey]string // each stream's model
	seen    map[streamKey]int64  // last batch, unix nanoseconds
	nStream atomic.Int64
	nModel  atomic.Int64
}

func newLimits() limits {
	return limits{models: map[string]int{}, modelOf: map[streamKey]string{}, seen: map[streamKey]int64{}}
}

// admit returns k's stream, creating it if the caps allow; nil and the drop
// reason otherwise. It also records that k was heard from now, under model.
func (s *Subscriber) admit(k streamKey, model string) (*stream, string) {
	now := time.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[k]
	if st == nil && len(s.streams) >= s.cfg.MaxStreams {
		return nil, "stream_limit"
	}
	if old, ok := s.limits.modelOf[k]; !ok || old != model {
		if s.limits.models[model] == 0 && len(s.limits.models) >= s.cfg.MaxModels {
			return nil, "model_limit"
		}
		if ok {
			s.releaseModelLocked(old)
		}
		s.limits.models[model]++
		s.limits.modelOf[k] = model
		s.limits.nModel.Store(int64(len(s.limits.models)))
	}
	if st == nil {
		st = &stream{key: k, worker: s.dispatcher.workerFor(k), lostCount: &s.lostStreams}
		st.stats.Pod, st.stats.DPRank = k.pod, k.rank
		s.streams[k] = st
		s.limits.nStream.Store(int64(len(s.streams)))
	}
	s.limits.seen[k] = now
	return st, ""
}

// admitBatch is admit for a decoded batch: its data-parallel rank must be
// under the limit, Config.Refuse must not refuse it and its stream must be
// admitted; otherwise the batch is dropped, counted and logged
// (rate-limited; a refused batch by Refuse), and nil returned.
func (s *Subscriber) admitBatch(src *source, b *event.Batch) *stream {
	if b.DPRank >= s.cfg.MaxDPRanks {
		s.drop("dp_rank_limit")
		s.warn(src.addr+"|"+b.Pod, "dropping KV events: data-parallel rank beyond the limit", "pod", b.Pod,
			"dp_rank", b.DPRank, "max_dp_ranks", s.cfg.MaxDPRanks)
		return nil
	}
	if s.cfg.Refuse != nil && s.cfg.Refuse(b) {
		return nil
	}
	st, why := s.admit(streamKey{b.Pod, b.DPRank}, b.Model)
	if st == nil {
		s.drop(why)
		s.warn(src.addr+"|"+why, "dropping KV events: subscriber limit reached", "endpoint", src.addr, "pod", b.Pod,
			"model", b.Model, "reason", why, "max_streams", s.cfg.MaxStreams, "max_models", s.cfg.MaxModels)
	}
	return st
}

func (s *Subscriber) releaseModelLocked(model string) {
	if s.limits.models[model]--; s.limits.models[model] <= 0 {
		delete(s.limits.models, model)
	}
	s.limits.nModel.Store(int64(len(s.limits.models)))
}

// forgetStreamLocked drops k from the streams and the limits' bookkeeping;
// s.mu is held.
func (s *Subscriber) forgetStreamLocked(k streamKey) {
	if st := s.streams[k]; st != nil {
		st.mu.Lock()
		if st.lostCount != nil && st.stats.IncompleteReason == whyIndexLost {
			st.lostCount.Add(-1) // out of the index_lost count; its stats stay as they were
		}
		st.lostCount = nil
		st.mu.Unlock()
	}
	delete(s.streams, k)
	if m, ok := s.limits.modelOf[k]; ok {
		delete(s.limits.modelOf, k)
		s.releaseModelLocked(m)
	}
	delete(s.limits.seen, k)
	s.limits.nStream.Store(int64(len(s.streams)))
}

// expireLoop forgets streams silent for PodExpiry until ctx ends.
func (s *Subscriber) expireLoop(ctx context.Context) {
	t := time.NewTicker(max(s.cfg.PodExpiry/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.expire(ctx, now)
		}
	}
}

// expire clears every stream silent since before now-PodExpiry from the
// sink, in order behind its last batches, and forgets it (the sink's
// ForgetPod drops its state for the pod too). A stream busy in a
// replay exchange is not silent and waits for the next round.
func (s *Subscriber) expire(ctx context.Context, now time.Time) {
	cut := now.Add(-s.cfg.PodExpiry).UnixNano()
	var gone []*stream
	s.mu.Lock()
	for k, seen := range s.limits.seen {
		st := s.streams[k]
		if seen > cut || st == nil || !st.order.TryLock() {
			continue
		}
		s.forgetStreamLocked(k)
		gone = append(gone, st)
	}
	s.mu.Unlock()
	for _, st := range gone {
		ss := st.currentStats()
		b := &event.Batch{Pod: st.key.pod, DPRank: st.key.rank, Model: ss.Model, Engine: ss.Engine,
			Seq: ss.LastSeq, Events: []event.Event{{Kind: event.AllBlocksCleared}}}
		if err := s.dispatcher.queue(ctx, st.worker, b); err == nil {
			s.metrics.SyntheticClears.WithLabelValues("expired").Inc()
			_ = s.dispatcher.queueForget(ctx, st.worker, st.key.pod, st.key.rank)
		}
		st.order.Unlock()
		s.metrics.limits.expired.Inc()
		s.log.Info("stream silent beyond the pod expiry: cleared and forgotten", "pod", st.key.pod,
			"dp_rank", st.key.rank, "last_seq", ss.LastSeq, "pod_expiry", s.cfg.PodExpiry)
	}
}

// logLimiter rate-limits log lines per source: a token bucket per key
// (endpoint and pod), so one malformed publisher writes a few lines and a
// "suppressed" count, not one line per message. Keys are bounded; beyond
// maxLogKeys every new source shares one bucket.
type logLimiter struct {
	mu         sync.Mutex
	buckets    map[string]*logBucket
	suppressed prometheus.Counter
}

type logBucket struct {
	tokens     float64
	last       time.Time
	suppressed int
}

const (
	logBurst    = 5
	logEvery    = 10 * time.Second // one more line allowed per key per logEvery
	maxLogKeys  = 1024
	logOverflow = "\x00other sources"
)

func newLogLimiter(suppressed prometheus.Counter) *logLimiter {
	return &logLimiter{buckets: map[string]*logBucket{}, suppressed: suppressed}
}

// allow reports whether key may log now and how many of its lines were
// suppressed since it last could.
func (l *logLimiter) allow(key string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= maxLogKeys {
			l.prune(now)
		}
		if len(l.buckets) >= maxLogKeys {
			key = logOverflow
			b = l.buckets[key]
		}
		if b == nil {
			b = &logBucket{tokens: logBurst, last: now}
			l.buckets[key] = b
		}
	}
	b.tokens = min(logBurst, b.tokens+now.Sub(b.last).Seconds()/logEvery.Seconds())
	b.last = now
	if b.tokens < 1 {
		b.suppressed++
		l.suppressed.Inc()
		return false, 0
	}
	b.tokens--
	n := b.suppressed
	b.suppressed = 0
	return true, n
}

// prune drops buckets that are full again and owe no summary: forgetting
// them changes nothing.
func (l *logLimiter) prune(now time.Time) {
	for k, b := range l.buckets {
		if b.suppressed == 0 && now.Sub(b.last) >= logBurst*logEvery {
			delete(l.buckets, k)
		}
	}
}

// warn logs a WARN line for source key unless that source is over its
// rate; the next line it may write says how many were suppressed.
func (s *Subscriber) warn(key, msg string, args ...any) {
	ok, n := s.logs.allow(key, time.Now())
	if !ok {
		return
	}
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	s.log.Log(context.Background(), slog.LevelWarn, msg, args...)
}
