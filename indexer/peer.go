package indexer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/indexer/persist"
)

// Recovery from a peer: a daemon that starts with no snapshot of its own
// fetches a live peer's in-memory index in the snapshot format
// (persist.Encode, served by the API at PeerSnapshotPath) and loads it
// through the snapshot's restore path: the copy records each (pod, rank)
// stream's last sequence number, the subscriber resumes each stream there
// (ResumeFrom), so the gap since the copy is replayed from the engines and a
// pod is served only once its stream proves it (kvevents/resume.go), as
// after a restart from a file. The peer's engines are the same engines, so
// only the seconds between the copy and the first batch need replaying,
// instead of each engine's whole cache.

// PeerSnapshotPath is the admin HTTP path a peer's copy is served at.
const PeerSnapshotPath = "/v1/admin/snapshot"

// HashConfigHeader carries HashConfigID both ways: the fetching daemon
// sends its own and the peer refuses a different one (409), and the peer's
// answer carries its own, which the fetching daemon checks again.
const HashConfigHeader = "X-Kvindex-Hash-Config"

// PeerConfig is where and how a daemon starting empty fetches a peer's
// index. The zero value (no URLs) turns it off.
type PeerConfig struct {
	// URLs are the peers' HTTP base URLs (http://host:port), tried in order
	// until one answers with a copy.
	URLs []string
	// Token is sent as a bearer token: serving a copy needs the admin
	// scope on the peer.
	Token string
	// MaxBytes bounds a copy (0 = Options.PeerMaxBytes' default); a larger
	// one is refused. The copy is held in memory while it is loaded.
	MaxBytes int64
	// Timeout bounds the whole recovery, every peer tried included (0 =
	// Options.PeerTimeout's default).
	Timeout time.Duration
	// Client makes the requests (nil = a plain http.Client).
	Client *http.Client
}

// ErrNotMemory: only the in-memory index has copies (Redis is shared).
var ErrNotMemory = errors.New("indexer: snapshots are of the in-memory index (Redis keeps the shared index itself)")

// HashConfigID names the block-key configuration (the default and every
// per-model one): two daemons with the same ID compute the same keys from
// the same tokens, so one's index answers the other's queries. A copy from
// a peer with another ID would hold keys no query here computes.
func (ix *Indexer) HashConfigID() string {
	var lines []string
	line := func(model string, algo, seed string, bs int) string {
		return fmt.Sprintf("%q %q %q %d", model, algo, seed, bs)
	}
	d := ix.keyCfg
	lines = append(lines, line("", string(d.Algo), d.Seed, d.BlockSize))
	for m, c := range ix.modelKeyCfg {
		lines = append(lines, line(m, string(c.Algo), c.Seed, c.BlockSize))
	}
	slices.Sort(lines[1:])
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:16])
}

// WriteSnapshot writes a copy of the in-memory index to w in the snapshot
// format, with each stream's last applied sequence number (read before the
// index, so the content is at least that new).
func (ix *Indexer) WriteSnapshot(w io.Writer) (persist.Written, error) {
	mem := ix.backend.memory
	if mem == nil {
		return persist.Written{}, ErrNotMemory
	}
	return persist.Encode(w, persist.Source{Index: mem, Interner: ix.in, Streams: ix.vouchedSeqs}, time.Now())
}

// vouchedSeqs are streamSeqs with each stream's completeness, which the
// copy's receiver grants once its stream continues the copy.
func (ix *Indexer) vouchedSeqs() []persist.StreamSeq { return ix.seqs(true) }

// CanSnapshot reports whether WriteSnapshot can work (the in-memory index).
func (ix *Indexer) CanSnapshot() bool { return ix.backend.memory != nil }

// streamSeqs are the streams' last applied sequence numbers.
func (ix *Indexer) streamSeqs() []persist.StreamSeq { return ix.seqs(false) }

// seqs lists every stream that applied a batch with its last sequence
// number and, when vouch, its completeness: a pod not served (restored,
// waiting for its stream) vouches for nothing.
func (ix *Indexer) seqs(vouch bool) []persist.StreamSeq {
	if ix.sub == nil {
		return nil
	}
	ss := ix.sub.Streams()
	out := make([]persist.StreamSeq, 0, len(ss))
	for _, s := range ss {
		if s.Batches == 0 && s.LastSeq == 0 {
			continue
		}
		seq := persist.StreamSeq{Pod: s.Pod, DPRank: s.DPRank, Seq: s.LastSeq}
		if vouch {
			seq.Complete = s.Complete && ix.sub.Servable(s.Pod, s.DPRank)
			seq.CompleteSince = s.CompleteSinceSeq
		}
		out = append(out, seq)
	}
	return out
}

// peerResults label kvindexd_peer_recovery_total.
var peerResults = []string{"ok", "hash_config", "too_large", "timeout", "unauthorized", "unreachable", "refused", "corrupt"}

type peerMetrics struct {
	attempts *prometheus.CounterVec
	seconds  prometheus.Gauge
	bytes    prometheus.Gauge
	entries  prometheus.Gauge
}

func newPeerMetrics(reg *prometheus.Registry) (*peerMetrics, error) {
	m := &peerMetrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindexd_peer_recovery_total",
			Help: "Fetches of a peer's index at start, by result (ok, hash_config: the peer keys blocks otherwise, too_large: over --peer-max-bytes, timeout: past --peer-timeout, unauthorized, unreachable, refused: any other answer, corrupt: the copy did not load)."},
			[]string{"result"}),
		seconds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindexd_peer_recovery_seconds",
			Help: "Time the successful fetch and load of a peer's index took at start (0 = none)."}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindexd_peer_recovery_bytes",
			Help: "Size of the peer's copy loaded at start (0 = none)."}),
		entries: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindexd_peer_recovery_entries",
			Help: "(block, pod) entries loaded from a peer's copy at start (0 = none)."}),
	}
	for _, r := range peerResults {
		m.attempts.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.attempts, m.seconds, m.bytes, m.entries} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// peerError is why one peer gave no copy; result is its metric label.
type peerError struct {
	result string
	err    error
}

func (e *peerError) Error() string { return e.err.Error() }

// recoverFromPeers loads the first copy a peer gives into the fresh index.
// Every failure is logged and counted and the daemon starts cold, as with
// an unloadable snapshot file; the error is only for the metrics'
// registration.
func (ix *Indexer) recoverFromPeers(cfg PeerConfig, lim persist.Limits, reg *prometheus.Registry) (*persist.Loaded, error) {
	mem := ix.backend.memory
	if mem == nil {
		return nil, ErrNotMemory
	}
	m, err := newPeerMetrics(reg)
	if err != nil {
		return nil, err
	}
	cfg.MaxBytes = Options.PeerMaxBytes.Or(cfg.MaxBytes)
	cfg.Timeout = Options.PeerTimeout.Or(cfg.Timeout)
	if cfg.Client == nil {
		cfg.Client = &http.Client{}
	}
	log := ix.log.With("component", "peer-recovery")
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	want := ix.HashConfigID()
	for _, base := range cfg.URLs {
		body, err := fetchPeer(ctx, cfg, base, want)
		if err != nil {
			var pe *peerError
			if errors.As(err, &pe) {
				m.attempts.WithLabelValues(pe.result).Inc()
			}
			if pe != nil && pe.result == "hash_config" {
				log.Error("peer refused: its block-key configuration (--hash-algo, --hash-seed, --block-size, per-model keys) differs from this daemon's; its index would not answer this daemon's queries",
					"peer", base, "err", err)
			} else {
				log.Warn("no index from peer", "peer", base, "err", err)
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		l, err := persist.LoadFrom(bytes.NewReader(body), int64(len(body)), "from peer "+base, mem, ix.in, lim)
		if err != nil {
			// The failed load leaves its models interned, so another
			// copy could not be loaded into this interner: start cold.
			m.attempts.WithLabelValues("corrupt").Inc()
			log.Error("peer's index not loaded: cold start", "peer", base, "err", err)
			return nil, nil
		}
		took := time.Since(t0)
		m.attempts.WithLabelValues("ok").Inc()
		m.seconds.Set(took.Seconds())
		m.bytes.Set(float64(len(body)))
		m.entries.Set(float64(l.Entries))
		log.Info("index loaded from a peer; its pods are served once their streams resume", "peer", base,
			"pods", len(l.Pods), "blocks", l.Blocks, "entries", l.Entries, "bytes", len(body), "took", took.Round(time.Millisecond))
		return l, nil
	}
	log.Warn("no peer gave its index: cold start, the engines' events fill the index", "peers", len(cfg.URLs),
		"took", time.Since(t0).Round(time.Millisecond))
	return nil, nil
}

// fetchPeer fetches one peer's copy, at most cfg.MaxBytes of it.
func fetchPeer(ctx context.Context, cfg PeerConfig, base, hashID string) ([]byte, error) {
	url := strings.TrimRight(base, "/") + PeerSnapshotPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, &peerError{"unreachable", fmt.Errorf("peer URL %q: %w", base, err)}
	}
	if cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.Token)
	}
	req.Header.Set(HashConfigHeader, hashID)
	resp, err := cfg.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, &peerError{"timeout", fmt.Errorf("past the deadline (--peer-timeout): %w", err)}
		}
		return nil, &peerError{"unreachable", err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		err := fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
		switch resp.StatusCode {
		case http.StatusConflict:
			return nil, &peerError{"hash_config", err}
		case http.StatusUnauthorized, http.StatusForbidden:
			return nil, &peerError{"unauthorized", err}
		}
		return nil, &peerError{"refused", err}
	}
	if got := resp.Header.Get(HashConfigHeader); got != hashID {
		return nil, &peerError{"hash_config", fmt.Errorf("peer's block-key configuration %q, this daemon's %q", got, hashID)}
	}
	if resp.ContentLength > cfg.MaxBytes {
		return nil, &peerError{"too_large", fmt.Errorf("copy of %d bytes, limit %d (--peer-max-bytes)", resp.ContentLength, cfg.MaxBytes)}
	}
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(resp.Body, cfg.MaxBytes+1))
	if n > cfg.MaxBytes {
		return nil, &peerError{"too_large", fmt.Errorf("copy over %d bytes (--peer-max-bytes)", cfg.MaxBytes)}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, &peerError{"timeout", fmt.Errorf("past the deadline (--peer-timeout) after %d bytes: %w", n, err)}
		}
		return nil, &peerError{"unreachable", fmt.Errorf("after %d bytes: %w", n, err)}
	}
	return buf.Bytes(), nil
}
