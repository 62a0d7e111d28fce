package applier

import (
	"sync"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/prometheus/client_golang/prometheus"
)

// Session affinity. vLLM echoes the triggering request's session_id on GPU
// BlockStored events (vllm-project/vllm PR #51381: prefix-cache stores and
// reuse reports, kv_cache_report_mode="full"); BlockRemoved stays
// hash-only. The applier remembers, per pod, the sessions that stored
// blocks there and each one's last stored block, so that a score or pick
// naming a session can prefer that session's pod among pods whose prefixes
// tie. Memory is bounded: at most SessionsPerPod sessions per pod, the
// least recently stored one evicted first (CLOCK-like second chance, O(1)
// amortised), counted in kvindexd_session_evictions_total. All pods
// together hold at most MaxSessions: at that cap a new session evicts the
// least recently stored one of the pod holding the most (the recording pod
// itself when it holds at least its fair part, MaxSessions / pods), counted
// in kvindexd_session_cap_evictions_total. So pods flooding sessions lose
// their own, and a pod below its fair part keeps what it has: 1,200 pods x
// 4,096 unique 256-byte ids (4.9M sessions, 3.3 GB) now stop at the cap.
//
// What losing a session costs: only affinity. A session never adds to a
// score or a match; it orders pods whose score and matched blocks tie
// (preferSession), so a forgotten session makes such a tie fall to the
// usual order (name) and the request may go to another pod that matches
// exactly as much. Scores, matches and completeness are unchanged.

// DefaultSessionsPerPod bounds the sessions remembered per pod.
const DefaultSessionsPerPod = 4096

// DefaultMaxSessions bounds the sessions remembered by all pods together:
// at most ~700 bytes each with 256-byte ids (the id, its map entry and its
// ring slot), so ~180 MB.
const DefaultMaxSessions = 1 << 18

// sessionTable is the applier's per-pod session memory.
type sessionTable struct {
	mu     sync.RWMutex
	limit  int // per pod; 0 = off
	global int // all pods together
	pods   map[kvindex.PodID]*podSessions
	n      int
	m      sessionMetrics
}

type podSessions struct {
	last  map[string]sessionEntry
	ring  []sessionSlot // one slot per entry, oldest first from head
	head  int
	clock uint64
}

type sessionEntry struct {
	key   blockkeys.Key // the session's last block stored on the pod
	stamp uint64        // when (pod-local clock)
}

type sessionSlot struct {
	name  string
	stamp uint64
}

type sessionMetrics struct {
	entries      prometheus.Gauge
	evictions    prometheus.Counter
	capEvictions prometheus.Counter
}

func newSessionMetrics(ns string) (sessionMetrics, []prometheus.Collector) {
	m := sessionMetrics{
		entries: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "session_entries",
			Help: "(pod, session) pairs remembered from BlockStored.session_id (bounded per pod by --max-sessions-per-pod, in all by --max-sessions)."}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "session_evictions_total",
			Help: "Sessions forgotten because their pod reached --max-sessions-per-pod (least recently stored first)."}),
		capEvictions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "session_cap_evictions_total",
			Help: "Sessions forgotten because all pods together reached --max-sessions (the least recently stored of the pod holding the most)."}),
	}
	return m, []prometheus.Collector{m.entries, m.evictions, m.capEvictions}
}

// record notes that session stored key (its last block) on pod.
func (t *sessionTable) record(pod kvindex.PodID, session string, key blockkeys.Key) {
	if t.limit <= 0 || session == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	sessions := t.pods[pod]
	if sessions == nil {
		sessions = &podSessions{last: make(map[string]sessionEntry)}
		t.pods[pod] = sessions
	}
	sessions.clock++
	if _, ok := sessions.last[session]; ok {
		sessions.last[session] = sessionEntry{key: key, stamp: sessions.clock}
		return
	}
	if len(sessions.last) >= t.limit {
		sessions.evict()
		t.n--
		t.m.evictions.Inc()
	} else if t.global > 0 && t.n >= t.global {
		t.evictForCap(sessions)
	}
	sessions.last[session] = sessionEntry{key: key, stamp: sessions.clock}
	sessions.ring = append(sessions.ring, sessionSlot{name: session, stamp: sessions.clock})
	t.n++
	t.m.entries.Set(float64(t.n))
}

// evictForCap makes room under the global cap for a new session of mine:
// the least recently stored session of the pod holding the most goes, mine
// when I hold at least my fair part (so a flood of new pods' sessions
// evicts its own in O(1)); finding the largest otherwise is one pass over
// the pods (at most --max-streams).
func (t *sessionTable) evictForCap(mine *podSessions) {
	victim := mine
	if len(mine.last) == 0 || len(mine.last) < t.global/len(t.pods) {
		for _, p := range t.pods {
			if len(p.last) > len(victim.last) {
				victim = p
			}
		}
	}
	if len(victim.last) == 0 {
		return
	}
	victim.evict()
	t.n--
	t.m.capEvictions.Inc()
}

// evict drops the least recently stored session: a slot whose session was
// stored again since it was queued goes back to the tail with its new stamp.
func (sessions *podSessions) evict() {
	for {
		s := sessions.ring[sessions.head]
		sessions.ring[sessions.head] = sessionSlot{}
		sessions.head++
		if e := sessions.last[s.name]; e.stamp != s.stamp {
			sessions.ring = append(sessions.ring, sessionSlot{name: s.name, stamp: e.stamp})
		} else {
			delete(sessions.last, s.name)
			break
		}
	}
	if sessions.head > len(sessions.ring)/2 { // compact: the ring stays within 2x the entries
		sessions.ring = append(sessions.ring[:0], sessions.ring[sessions.head:]...)
		sessions.head = 0
	}
}

// forget drops everything remembered for pod (its cache was cleared or the
// pod forgotten: its sessions' blocks are gone).
func (t *sessionTable) forget(pod kvindex.PodID) {
	if t.limit <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if sessions := t.pods[pod]; sessions != nil {
		t.n -= len(sessions.last)
		delete(t.pods, pod)
		t.m.entries.Set(float64(t.n))
	}
}

// SessionPods appends to dst the pods that session stored blocks on (any
// order) and returns it.
func (a *Applier) SessionPods(dst []kvindex.PodID, session string) []kvindex.PodID {
	t := &a.sessions
	if t.limit <= 0 || session == "" {
		return dst
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	for p, sessions := range t.pods {
		if _, ok := sessions.last[session]; ok {
			dst = append(dst, p)
		}
	}
	return dst
}

// SessionLastBlock is the last block session stored on pod, if remembered.
func (a *Applier) SessionLastBlock(pod kvindex.PodID, session string) (blockkeys.Key, bool) {
	t := &a.sessions
	t.mu.RLock()
	defer t.mu.RUnlock()
	if sessions := t.pods[pod]; sessions != nil {
		e, ok := sessions.last[session]
		return e.key, ok
	}
	return 0, false
}
