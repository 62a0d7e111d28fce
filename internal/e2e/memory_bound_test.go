package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
)

// TestMemoryBoundHostilePublishers runs the real binary with its default
// limits and feeds it, through its bind port, everything a publisher can
// make it hold at once: 400 pods storing 40,000 blocks each in two
// full-attention groups (the copy-count and group-mask tables reach their
// 256 MiB bound and the index its capacity), then 100,000 distinct pod
// names of 253 bytes (a few of 1 MB) over 1,000 models whose blocks carry
// token ids (digest caches) with hashes that never match (alias tables),
// payloads just under the message cap that declare millions of hashes, and
// 100 MB messages, and 280,000 sessions with 256-byte ids (past the
// global cap). It reports the daemon's peak RSS and checks it stays
// under maxPeakRSS (docs/security.md, "Memory bound"), that /metrics and
// /v1/pods stay small and valid, and that the daemon still serves. It takes
// a minute and ~1.4 GB: set KVINDEX_MEMORY_BOUND=1 to run it.
//
//	KVINDEX_MEMORY_BOUND=1 go test -run TestMemoryBoundHostilePublishers -v -timeout 30m ./internal/e2e/
func TestMemoryBoundHostilePublishers(t *testing.T) {
	if os.Getenv("KVINDEX_MEMORY_BOUND") == "" {
		t.Skip("set KVINDEX_MEMORY_BOUND=1 (a minute, ~1.4 GB)")
	}
	const maxPeakRSS = 2 << 30
	d := harness.Start(t, "--hash-seed", "0", "--log-level", "warn")
	zmqAddr := d.ZMQ
	base := "http://" + d.HTTP
	rss0 := procStatus(t, d.PID(), "VmRSS")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	pub := dialPub(t, ctx, zmqAddr)
	rng := rand.New(rand.NewPCG(9, 9))
	sent := 0
	send := func(p *enginepub.Publisher, topic string, seq uint64, b *event.Batch) {
		// The map form, as vLLM publishes events with a session_id.
		payload, err := enginepub.EncodeVLLMBatch(b, enginepub.VLLMEncodeOptions{MapForm: b.Events[0].SessionID != ""})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Publish(topic, seq, payload); err != nil {
			t.Fatalf("publish: %v", err)
		}
		sent++
	}
	// First the per-pod hold tables (copy counts and group masks): pods
	// storing blocks in two full-attention groups grow both tables, 400
	// pods of 40,000 blocks each is enough to reach their 256 MiB bound
	// (a table is at most 65,536 entries, ~790 KB). This comes first
	// because the 100k pods below take every remaining stream slot.
	const tablePods, tableBlocks, perBatch = 400, 40_000, 2_000
	for i := 0; i < tablePods; i++ {
		topic := fmt.Sprintf("kv@table-%03d@org/table-model", i)
		for seq := uint64(0); seq < tableBlocks/perBatch; seq++ {
			hashes := make([]uint64, perBatch)
			for j := range hashes {
				hashes[j] = rng.Uint64()
			}
			g0 := event.Event{Kind: event.BlockStored, BlockHashes: hashes, BlockSize: 16, GroupKind: event.GroupFullAttention}
			g1 := g0
			g1.GroupIdx = 1
			send(pub, topic, seq, &event.Batch{Events: []event.Event{g0, g1}})
		}
	}
	waitReceived(t, base, sent)
	tables := metricValue(t, base, "kvindexd_hold_table_bytes")

	// Sessions: the same pods store one block per event, each under a new
	// 256-byte session id (the longest kept), 700 per pod: 280,000 in
	// all, past the 262,144 of --max-sessions.
	const sessionsPerPod, sessionsPerBatch = 700, 100
	for i := 0; i < tablePods; i++ {
		topic := fmt.Sprintf("kv@table-%03d@org/table-model", i)
		for s := 0; s < sessionsPerPod; s += sessionsPerBatch {
			evs := make([]event.Event, sessionsPerBatch)
			for j := range evs {
				id := fmt.Sprintf("session-%03d-%04d-", i, s+j)
				id += strings.Repeat("s", event.MaxSessionIDLen-len(id))
				evs[j] = event.Event{Kind: event.BlockStored, BlockHashes: []uint64{rng.Uint64()}, BlockSize: 16, SessionID: id}
			}
			send(pub, topic, uint64(tableBlocks/perBatch+s/sessionsPerBatch), &event.Batch{Events: evs})
		}
	}
	waitReceived(t, base, sent)
	sessions := metricValue(t, base, "kvindexd_session_entries")

	// 100k pods of 253-byte names over 1,000 models; 4 blocks each with
	// token ids and hashes that are not the blocks' keys.
	for i := 0; i < 100_000; i++ {
		pod := fmt.Sprintf("hostile-%06d-", i)
		pod += strings.Repeat(string(rune('a'+i%26)), 253-len(pod))
		hashes := make([]uint64, 4)
		for j := range hashes {
			hashes[j] = rng.Uint64()
		}
		toks := make([]uint32, 4*16)
		for j := range toks {
			toks[j] = rng.Uint32N(150000)
		}
		b := &event.Batch{Events: []event.Event{{Kind: event.BlockStored, BlockHashes: hashes, TokenIDs: toks, BlockSize: 16}}}
		send(pub, fmt.Sprintf("kv@%s@org/model-%04d", pod, i%1000), 0, b)
	}
	// 1 MB pod names
	for i := 0; i < 20; i++ {
		send(pub, "kv@"+strings.Repeat("p", 1<<20)+strconv.Itoa(i)+"@m", 0, &event.Batch{Events: []event.Event{{Kind: event.AllBlocksCleared}}})
	}
	// 60 MB payloads of one-byte hashes: under the message cap, over the
	// elements cap
	big := append([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x93, 0xac}, "BlockRemoved"...)
	n := 60 << 20
	big = append(big, 0xdd, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	big = append(big, bytes.Repeat([]byte{1}, n)...)
	big = append(big, 0xc0)
	for i := 0; i < 4; i++ {
		var s8 [8]byte
		binary.BigEndian.PutUint64(s8[:], uint64(i))
		if err := pub.SendFrames([]byte("kv@big@m"), s8[:], big); err != nil {
			t.Fatal(err)
		}
		sent++
	}
	waitReceived(t, base, sent)
	pub.Close()
	// 100 MB messages: over the cap, each closes its connection
	hundred := bytes.Repeat([]byte{0x01}, 100<<20)
	for i := 0; i < 3; i++ {
		p := dialPub(t, ctx, zmqAddr)
		_ = p.SendFrames([]byte("kv@huge@m"), make([]byte, 8), hundred)
		p.Close()
	}

	metricsBody, took := get(t, base+"/metrics")
	podsBody, _ := get(t, base+"/v1/pods")
	if !json.Valid(podsBody) {
		t.Fatal("/v1/pods is not valid JSON")
	}
	peak := procStatus(t, d.PID(), "VmHWM")
	rss := procStatus(t, d.PID(), "VmRSS")
	t.Logf("RSS at start %d MB, after the flood %d MB, peak %d MB; hold tables %.0f MB; %.0f sessions; /metrics %d KB in %v, /v1/pods %d KB",
		rss0>>20, rss>>20, peak>>20, tables/1e6, sessions, len(metricsBody)>>10, took.Round(time.Millisecond), len(podsBody)>>10)
	if sessions < 262_144 {
		t.Errorf("kvindexd_session_entries = %.0f: the session phase should fill --max-sessions (262,144)", sessions)
	}
	if tables < 200e6 {
		t.Errorf("kvindexd_hold_table_bytes = %.0f MB: the table phase should bring the tables near their 256 MiB bound", tables/1e6)
	}
	for _, l := range strings.Split(string(metricsBody), "\n") {
		if strings.HasPrefix(l, "kvindexd_kvevents_dropped_frames_total") || strings.HasPrefix(l, "kvindexd_hold_table") || strings.HasPrefix(l, "kvindexd_index_entries ") || strings.HasPrefix(l, "kvindexd_kvevents_zmq_oversized") ||
			strings.HasPrefix(l, "kvindexd_kvevents_streams ") || strings.HasPrefix(l, "kvindexd_kvevents_models ") ||
			strings.HasPrefix(l, "kvindexd_digest_caches ") || strings.HasPrefix(l, "kvindexd_alias_tables ") {
			t.Log(l)
		}
	}
	if peak > maxPeakRSS {
		t.Fatalf("peak RSS %d MB over the %d MB bound", peak>>20, maxPeakRSS>>20)
	}
	if len(metricsBody) > 64<<20 {
		t.Fatalf("/metrics is %d MB", len(metricsBody)>>20)
	}
	if err := harness.WaitReady(d.HTTP, d.Exited(), harness.ReadyLimit); err != nil {
		t.Fatalf("the daemon stopped serving after the flood: %v", err)
	}
}

func dialPub(t *testing.T, ctx context.Context, addr string) *enginepub.Publisher {
	t.Helper()
	p, err := enginepub.NewPublisher(addr, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WaitSubscribed(ctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	return p
}

func get(t *testing.T, url string) ([]byte, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %v", url, resp.StatusCode, err)
	}
	return b, time.Since(start)
}

// waitReceived waits until the daemon has taken n messages off its bind
// socket (and so decoded, dropped or queued each).
func waitReceived(t *testing.T, base string, n int) {
	t.Helper()
	series := `kvindexd_kvevents_messages_received_total{socket="bind"}`
	wait.UntilWithin(t, 10*time.Minute, fmt.Sprintf("%d messages received", n), func() string {
		body, _ := get(t, base+"/metrics")
		if got := harness.MetricIn(string(body), series); int(got) < n {
			return fmt.Sprintf("%s = %v", series, got)
		}
		return ""
	})
}

// procStatus reads a "kB" field of /proc/<pid>/status, in bytes.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// metricValue reads one unlabelled sample of /metrics.
func metricValue(t *testing.T, base, name string) float64 {
	t.Helper()
	body, _ := get(t, base+"/metrics")
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}
