package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/persist"
	"github.com/kvindex/kvindex/internal/testkit/pypub"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvindex"
)

// A daemon restarted from its snapshot answers with what its engines held
// once their streams resume, without waiting for them to re-announce their
// caches: pod-a continues its sequence and is served with the restored
// blocks plus its new ones; pod-b restarted while the daemon was down (its
// seq went back to 0) and is served only with what it stored since.
// Before its first batch, a restored pod is listed stale and not scored.
func TestRestartFromSnapshot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvindex.snap")
	withSnapshot := func(c *Config) {
		c.SnapshotPath, c.SnapshotInterval = path, Duration(50*time.Millisecond)
	}
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: e2eSeed, BlockSize: e2eBlock})
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 8*e2eBlock)
	for i := range tokens {
		tokens[i] = uint32(500 + i)
	}
	keys := h.Keys(nil, tokens, blockkeys.RequestExtras{})
	q := query{model: e2eModel, tokens: tokens}

	first := startInProcess(t, withSnapshot)
	pub := pypub.StartPublisher(t, first.bind, false)
	pub.WaitReady(waitLimit)
	for _, pod := range []string{"pod-a", "pod-b"} {
		pub.Send(pypub.Batch{Topic: "kv@" + pod + "@" + e2eModel, Seq: 5, Form: "map", DPRank: pypub.Rank(0),
			Events: []pypub.Event{stored(keys, tokens, 0, 6, "")}})
	}
	first.expect("before the restart", q, "pod-a=6 pod-b=6")
	wait.Until(t, "snapshot with both pods", func() string {
		l, err := persist.Load(path, kvindex.NewMemoryIndex(kvindex.MemoryConfig{}), kvindex.NewInterner())
		if err != nil {
			return err.Error()
		}
		if l.Entries == 12 {
			return ""
		}
		return "still " + fmt.Sprintf("%d entries", l.Entries)
	})

	second := startInProcess(t, withSnapshot)
	second.expect("restored pods before their streams resume", q, "")
	code, body := second.get("/v1/pods")
	var pods struct {
		Pods []struct {
			Pod     string `json:"pod"`
			Stale   bool   `json:"stale"`
			Blocks  int64  `json:"blocks"`
			LastSeq uint64 `json:"last_seq"`
		} `json:"pods"`
	}
	if err := json.Unmarshal([]byte(body), &pods); code != 200 || err != nil || len(pods.Pods) != 2 {
		t.Fatalf("/v1/pods: %d %s", code, body)
	}
	for _, p := range pods.Pods {
		if !p.Stale || p.Blocks != 6 || p.LastSeq != 5 {
			t.Errorf("restored pod %+v, want stale with 6 blocks at seq 5", p)
		}
	}
	if _, m := second.get("/metrics"); !strings.Contains(m, "kvindexd_snapshot_restored_entries 12") ||
		!strings.Contains(m, "kvindexd_snapshot_stale_pods 2") {
		t.Errorf("snapshot metrics missing:\n%s", grepLines(m, "kvindexd_snapshot"))
	}

	pub2 := pypub.StartPublisher(t, second.bind, false)
	pub2.WaitReady(waitLimit)
	pub2.Send(pypub.Batch{Topic: "kv@pod-a@" + e2eModel, Seq: 6, Form: "map", DPRank: pypub.Rank(0),
		Events: []pypub.Event{stored(keys, tokens, 6, 8, "")}})
	pub2.Send(pypub.Batch{Topic: "kv@pod-b@" + e2eModel, Seq: 0, Form: "map", DPRank: pypub.Rank(0),
		Events: []pypub.Event{stored(keys, tokens, 0, 2, "")}})
	second.expect("after the streams resumed", q, "pod-a=8 pod-b=2")
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// --peers takes http(s) base URLs and the in-memory index; the bounds are
// their rows' ranges; the token file must hold a token.
func TestPeersConfig(t *testing.T) {
	noenv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--peers", "kvindexd-0:8080"}, "http:// or https://"},
		{[]string{"--peers", "tcp://kvindexd-0:8080"}, "http:// or https://"},
		{[]string{"--peers", "http://"}, "http:// or https://"},
		{[]string{"--peers", "http://kvindexd-0:8080", "--index", "redis://127.0.0.1:1"}, "in-memory index"},
		{[]string{"--peers", "http://kvindexd-0:8080", "--peer-max-bytes", "10"}, "peer-max-bytes"},
		{[]string{"--peers", "http://kvindexd-0:8080", "--peer-timeout", "0s"}, "peer-timeout"},
		{[]string{"--peer-selector", "app in ("}, "--peer-selector"},
		{[]string{"--peer-selector", "app=kvindexd", "--index", "redis://127.0.0.1:1"}, "in-memory index"},
		{[]string{"--peer-selector", "app=kvindexd", "--peer-port", "70000"}, "--peer-port"},
	} {
		if _, err := loadConfig(tc.args, noenv, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	cfg, err := loadConfig([]string{"--peers", "http://a:8080,https://b:8443", "--peer-token-file", filepath.Join(t.TempDir(), "none")}, noenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Peers, " "); got != "http://a:8080 https://b:8443" {
		t.Errorf("peers %q", got)
	}
	if _, err := cfg.peerConfig(); err == nil || !strings.Contains(err.Error(), "--peer-token-file") {
		t.Errorf("missing token file: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.PeerTokenFile = empty
	if _, err := cfg.peerConfig(); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty token file: %v", err)
	}
}

// --peer-selector lists the replicas once at start; a failure (here an API
// server that refuses connections, or no port to ask the peers on) leaves
// no discovered peer, a cold start, rather than a daemon that will not
// start.
func TestPeerSelectorFailureStartsCold(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
contexts: [{name: c, context: {cluster: c}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	noenv := func(string) string { return "" }
	cfg, err := loadConfig([]string{"--peer-selector", "app=kvindexd", "--peer-namespace", "kvindex", "--kubeconfig", kubeconfig,
		"--peer-timeout", "2s"}, noenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if got := cfg.discoverPeers(context.Background(), log); got != nil {
		t.Errorf("peers %v from an unreachable API server", got)
	}
	if !strings.Contains(logs.String(), "peer discovery failed") || !strings.Contains(logs.String(), "127.0.0.1:1") {
		t.Errorf("the failure is not logged with its reason: %s", logs.String())
	}
	cfg.HTTPAddr = "unix:///tmp/kvindexd.sock"
	if _, err := cfg.listPeers(context.Background()); err == nil || !strings.Contains(err.Error(), "--peer-port") {
		t.Errorf("no TCP port to ask the peers on: %v, want an error naming --peer-port", err)
	}
}
