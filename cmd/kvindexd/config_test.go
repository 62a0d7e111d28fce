package main

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	// Explicit tokenizers must exist at start: give both a tokenizer.json.
	for _, m := range []string{"big", "small"} {
		if err := os.MkdirAll(filepath.Join(dir, m), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, m, "tokenizer.json"), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(dir, "kvindexd.yaml")
	err := os.WriteFile(file, []byte(`
http_addr: ":9000"
grpc_addr: ":9001"
hash_seed: "42"
block_size: 32
endpoints:
  - {address: "tcp://10.0.0.1:5557", pod: p1, model: m1}
models:
  big/model: {hash_algo: sha256_cbor, block_size: 64, tokenizer: `+filepath.Join(dir, "big")+`}
tokenizers: {small/model: `+filepath.Join(dir, "small")+`}
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KVINDEX_HTTP_ADDR": ":9100", "KVINDEX_BLOCK_SIZE": "64",
		"KVINDEX_ENDPOINT": "tcp://10.0.0.2:5557,pod=p2;tcp://10.0.0.3:5557,engine=sglang"}
	cfg, err := loadConfig([]string{"--config", file, "--http-addr", ":9200", "--endpoint", "tcp://10.0.0.4:5557,pod=p4,replay=tcp://10.0.0.4:5558,snapshot=tcp://10.0.0.4:5559"},
		func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// flag > env > file > default
	if cfg.HTTPAddr != ":9200" || cfg.GRPCAddr != ":9001" || cfg.BlockSize != 64 || cfg.HashSeed != "42" || cfg.ZMQBind != "tcp://*:5557" {
		t.Fatalf("precedence: %+v", cfg)
	}
	var eps []string
	for _, e := range cfg.Endpoints {
		eps = append(eps, e.Address+"|"+e.Pod+"|"+e.Model+"|"+e.Engine+"|"+e.Replay+"|"+e.Snapshot)
	}
	want := "tcp://10.0.0.1:5557|p1|m1|||,tcp://10.0.0.2:5557|p2||||,tcp://10.0.0.3:5557|||sglang||,tcp://10.0.0.4:5557|p4|||tcp://10.0.0.4:5558|tcp://10.0.0.4:5559"
	if got := strings.Join(eps, ","); got != want {
		t.Fatalf("endpoints:\n got %s\nwant %s", got, want)
	}
	def, per, err := cfg.keyConfigs()
	if err != nil {
		t.Fatal(err)
	}
	if def != (blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "42", BlockSize: 64}) {
		t.Errorf("default key config %+v", def)
	}
	if per["big/model"] != (blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256CBOR, Seed: "42", BlockSize: 64}) {
		t.Errorf("per-model key config %+v", per["big/model"])
	}
}

func TestConfigJSONFileAndErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.json")
	if err := os.WriteFile(file, []byte(`{"index": "memory", "tier_weights": "gpu=1,cpu=0.5"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig([]string{"--config=" + file}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := parseTierWeights(cfg.TierWeights)
	if w[event.TierCPU] != 0.5 || w[event.TierDisk] != kvindex.DefaultTierWeights()[event.TierDisk] {
		t.Errorf("tier weights %v", w)
	}
	bad := filepath.Join(dir, "bad.json")
	_ = os.WriteFile(bad, []byte(`{"grpc_adr": ":1"}`), 0o644)
	for _, args := range [][]string{
		{"--hash-algo", "md5"},
		{"--block-size", "0"},
		{"--tier-weights", "gpu=x"},
		{"--tier-weights", "tpu=1"},
		// issue 35: each weight within kvindex.TierWeightOption's range
		{"--tier-weights", "gpu=NaN"},
		{"--tier-weights", "gpu=+Inf"},
		{"--tier-weights", "gpu=1e308"},
		{"--tier-weights", "cpu=-1"},
		{"--tier-weights", "shared=0.6"}, // above disk's 0.5: storage would outrank own blocks
		{"--pod-share", "9223372036854775807"},
		{"--pod-share", "-1"},
		{"--endpoint", "tcp://a:1,color=blue"},
		{"--endpoint", "tcp://a:1,engine=tgi"},
		{"--log-format", "xml"},
		{"--config", bad},
		{"--grpc-addr", "", "--http-addr", ""},
		{"stray"},
	} {
		if _, err := loadConfig(args, func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	if _, err := loadConfig(nil, func(k string) string {
		if k == "KVINDEX_WORKERS" {
			return "many"
		}
		return ""
	}, io.Discard); err == nil || !strings.Contains(err.Error(), "KVINDEX_WORKERS") {
		t.Errorf("bad env: %v", err)
	}
}

func TestHelpListsSubcommands(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"help"}, nil, &out, &out); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	for name := range subcommands {
		if listed := strings.Contains(out.String(), "  "+name+" "); listed == hiddenSubcommands[name] {
			t.Errorf("help lists %q: %v, want %v:\n%s", name, listed, !hiddenSubcommands[name], out.String())
		}
	}
	out.Reset()
	if code := run([]string{"no-such"}, nil, &out, &out); code != 2 {
		t.Errorf("unknown subcommand exit %d", code)
	}
	out.Reset()
	if code := run([]string{"help", "serve"}, nil, &out, &out); code != 0 || !strings.Contains(out.String(), "-grpc-addr") {
		t.Errorf("help serve: %d %s", code, out.String())
	}
}

func TestConfigChecksTokenizersAtStart(t *testing.T) {
	dir := t.TempDir()
	noenv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tokenizer", "M=" + filepath.Join(dir, "missing")}, "--tokenizer M=" + filepath.Join(dir, "missing") + ": no tokenizer.json"},
		{[]string{"--tokenizers-dir", filepath.Join(dir, "nope")}, "not a directory"},
	} {
		if _, err := loadConfig(tc.args, noenv, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	yml := filepath.Join(dir, "c.yaml")
	_ = os.WriteFile(yml, []byte("models:\n  m: {tokenizer: "+filepath.Join(dir, "gone")+"}\n"), 0o644)
	if _, err := loadConfig([]string{"--config", yml}, noenv, io.Discard); err == nil || !strings.Contains(err.Error(), "models[m].tokenizer") {
		t.Errorf("models.m.tokenizer missing: %v", err)
	}
	// The committed Qwen3 tokenizer (the one `make run` serves) passes.
	if _, err := loadConfig([]string{"--tokenizer", "Qwen/Qwen3-8B=../../tokenization/testdata/qwen3"}, noenv, io.Discard); err != nil {
		t.Error(err)
	}
}

func TestConfigDiscovery(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "d.yaml")
	err := os.WriteFile(file, []byte(`
discovery:
  enabled: true
  namespaces: [llm-a, llm-b]
  selector: app=vllm
  replay_port: 5558
  dp_size: 2
  pod_name: "{{.Name}}"
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KVINDEX_DISCOVER_ZMQ_PORT": "6000"}
	cfg, err := loadConfig([]string{"--config", file, "--discover-namespace", "llm-c", "--discover-model-key", "model"},
		func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := cfg.discoveryConfig()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(dc.Namespaces, ","); got != "llm-a,llm-b,llm-c" || dc.Selector != "app=vllm" || dc.ZMQPort != 6000 ||
		dc.ReplayPort != 5558 || dc.DPSize != 2 || dc.ServePort != 8000 || dc.PodName != "{{.Name}}" || dc.ModelKey != "model" ||
		dc.Resync.String() != "5m0s" || dc.MaxPods != 4096 {
		t.Fatalf("discovery config %+v", dc)
	}
	noenv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--discover-pods"}, "needs --discover-selector"},
		{[]string{"--discover-pods", "--discover-selector", "app=vllm", "--leases", "--index", "redis://127.0.0.1:1"}, "do not combine"},
		{[]string{"--discover-pods", "--discover-selector", "app in ("}, "label selector"},
		{[]string{"--discover-pods", "--discover-selector", "a=b", "--discover-engine", "tgi"}, "--discover-engine"},
		{[]string{"--discover-pods", "--discover-selector", "a=b", "--discover-resync", "often"}, "discover-resync"},
		{[]string{"--discover-pods", "--discover-selector", "a=b", "--discover-pod-name", "{{.Pod}}"}, "pod name template"},
	} {
		if _, err := loadConfig(tc.args, noenv, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	// Outside a cluster without a kubeconfig, the daemon says why it cannot start.
	cfg, err = loadConfig([]string{"--discover-pods", "--discover-selector", "app=vllm", "--kubeconfig", filepath.Join(dir, "none"),
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--zmq-bind", "tcp://127.0.0.1:0"}, noenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	d, err := newDaemon(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		d.close()
		t.Fatal("newDaemon with a missing kubeconfig succeeded")
	}
	if !strings.Contains(err.Error(), "--discover-pods") {
		t.Fatalf("newDaemon: %v", err)
	}
}
