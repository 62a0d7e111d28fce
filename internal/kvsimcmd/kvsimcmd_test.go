package kvsimcmd

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/sim"
)

const smallScenario = "../../sim/testdata/scenarios/small.yaml"

func TestGenWorkloadRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := GenWorkload([]string{"--groups", "2", "--prompts", "1"}, nil, &buf, io.Discard); err != nil {
		t.Fatal(err)
	}
	back, err := sim.ReadTrace(&buf)
	if err != nil || len(back) != 2 {
		t.Fatalf("round trip: %v, %d", err, len(back))
	}
}

func TestSimulateCommandOutputs(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	args := []string{"--gen-workload", "--gen-groups", "20", "--gen-rate", "50", "--pods", "4", "--capacity", "200",
		"--routers", "random,round-robin,least-loaded,chwbl,approx-prefix,aibrix,sglang",
		"--out", filepath.Join(dir, "r.json"), "--svg", filepath.Join(dir, "c.svg"), "--markdown"}
	if err := Simulate(args, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "| aibrix |") || !strings.Contains(out.String(), "unbounded-cache hit rate 68.3%") {
		t.Fatalf("table:\n%s", out.String())
	}
	var rep sim.Report
	f, _ := os.ReadFile(filepath.Join(dir, "r.json"))
	if err := json.Unmarshal(f, &rep); err != nil || len(rep.Results) != 7 || rep.Results[4].Policy != "approx-prefix" {
		t.Fatalf("json: %v %+v", err, rep)
	}
	s, _ := os.ReadFile(filepath.Join(dir, "c.svg"))
	d := xml.NewDecoder(bytes.NewReader(s))
	for {
		if _, err := d.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("svg is not well-formed: %v", err)
		}
	}
	if err := Simulate(append(args[:len(args)-5:len(args)-5], "--out", filepath.Join(dir, "r.csv")), nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(mustOpen(t, filepath.Join(dir, "r.csv"))).ReadAll()
	if err != nil || len(rows) != 8 || rows[0][0] != "policy" {
		t.Fatalf("csv: %v %v", err, rows)
	}
	for _, bad := range [][]string{{}, {"--gen-workload", "--routers", "nope"}, {"--gen-workload", "--capacity", "0"},
		{"--gen-workload", "--speedup", "NaN"}, {"--gen-workload", "--event-lag", "-1"}, {"--gen-workload", "--pods", "0"},
		{"--gen-workload", "--policy", "s3fifo", "--small-ratio", "0"}, {"--gen-workload", "--router-replicas", "0"},
		{"--trace", "/nonexistent/trace.jsonl"}, {"--gen-workload", "--trace", "x"},
		// Router parameters that would leave a ring or a table empty are errors, not panics.
		{"--gen-workload", "--chwbl-replication", "0"}, {"--gen-workload", "--chwbl-head-blocks", "0"},
		{"--gen-workload", "--aibrix-blocks", "0"}, {"--gen-workload", "--sglang-tree-blocks", "0"},
		{"--gen-workload", "--approx-capacity", "-5"}} {
		if err := Simulate(bad, nil, io.Discard, io.Discard); err == nil {
			t.Errorf("accepted %v", bad)
		}
	}
}

func mustOpen(t *testing.T, p string) io.Reader {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

func TestRunReplayJSON(t *testing.T) {
	trace := `{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}
{"timestamp": 1, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}
`
	var out, errb bytes.Buffer
	err := Replay([]string{"--trace", "-", "--policy", "s3fifo", "--capacity", "20", "--per-request"},
		strings.NewReader(trace), &out, &errb)
	if err != nil {
		t.Fatal(err, errb.String())
	}
	want := `{"policy":"s3fifo","capacity":20,"block_size":512,"requests":2,"total_prompt_tokens":1400,"total_hit_tokens":700,"overall_hit_rate":0.5,"final_cache_blocks":2,"per_request":[{"prompt_tokens":700,"hit_tokens":0},{"prompt_tokens":700,"hit_tokens":700}]}` + "\n"
	if out.String() != want {
		t.Fatalf("got  %s\nwant %s", out.String(), want)
	}
	// --per-request always prints the array, even for a trace with no requests.
	out.Reset()
	if err := Replay([]string{"--trace", "-", "--capacity", "5", "--per-request"}, strings.NewReader("\n"), &out, &errb); err != nil {
		t.Fatal(err)
	}
	if want := `{"policy":"lru","capacity":5,"block_size":512,"requests":0,"total_prompt_tokens":0,"total_hit_tokens":0,"overall_hit_rate":0,"final_cache_blocks":0,"per_request":[]}` + "\n"; out.String() != want {
		t.Fatalf("empty trace: got %s want %s", out.String(), want)
	}
	for _, bad := range [][]string{
		{"--policy", "lru", "--capacity", "5"},
		{"--trace", "-", "--policy", "lru", "--capacity", "0"},
		{"--trace", "-", "--policy", "mru", "--capacity", "5"},
	} {
		if err := Replay(bad, strings.NewReader(trace), &out, &errb); err == nil {
			t.Errorf("Replay(%v) accepted", bad)
		}
	}
	if err := Replay([]string{"--trace", "-", "--capacity", "5"}, strings.NewReader("{bad\n"), &out, &errb); err == nil ||
		!strings.Contains(err.Error(), "line 1") {
		t.Errorf("malformed trace: err %v, want line 1", err)
	}
}

func TestSimulateScenarioCommand(t *testing.T) {
	dir := t.TempDir()
	path := smallScenario
	out, svg := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.svg")
	var stdout, stderr bytes.Buffer
	if err := Simulate([]string{"--scenario", path, "--out", out, "--svg", svg, "--markdown"}, nil, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "| precise |") || !strings.Contains(stdout.String(), "precise TTFT p90") {
		t.Errorf("stdout:\n%s", stdout.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Results) != 6 {
		t.Fatalf("%d results", len(doc.Results))
	}
	for _, k := range []string{"scheduler", "output_tokens_per_s", "requests_per_s", "ttft_p90_s", "ttft_mean_s", "itl_mean_s", "hit_rate", "stages"} {
		if _, ok := doc.Results[0][k]; !ok {
			t.Errorf("result lacks %q", k)
		}
	}
	s, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(s), "<polyline"); n != 12 || !strings.Contains(string(s), "TTFT p90") ||
		strings.Contains(string(s), "NaN") || strings.Contains(string(s), "Inf") {
		t.Errorf("svg has %d polylines", n)
	}
	if err := Simulate([]string{"--scenario", path, "--trace", "x"}, nil, &stdout, &stderr); err == nil {
		t.Error("--scenario with --trace accepted")
	}
	if err := Simulate([]string{"--scenario", filepath.Join(dir, "missing.yaml")}, nil, &stdout, &stderr); err == nil {
		t.Error("missing scenario file accepted")
	}
	// --scale changes the engine: a slower decode step lowers every
	// scheduler's throughput; bad keys, factors and uses are errors.
	var doc2 struct {
		Results []map[string]any `json:"results"`
	}
	simulateOut(t, filepath.Join(dir, "s.json"), &doc2, &stdout, "--scenario", path, "--scale", "decode_itl_s=2")
	for i := range doc.Results {
		if base, slow := doc.Results[i]["output_tokens_per_s"].(float64), doc2.Results[i]["output_tokens_per_s"].(float64); !(slow < base) {
			t.Errorf("%v: %.1f tok/s with decode_itl_s x2, %.1f without", doc.Results[i]["scheduler"], slow, base)
		}
	}
	// --router-replicas runs every scheduler as that many pickers: the
	// approximate profile's groups spread over more pods.
	var doc3 struct {
		RouterReplicas int              `json:"router_replicas"`
		Results        []map[string]any `json:"results"`
	}
	simulateOut(t, filepath.Join(dir, "r3.json"), &doc3, &stdout, "--scenario", path, "--router-replicas", "3")
	if doc3.RouterReplicas != 3 || !strings.Contains(stdout.String(), "as 3 independent pickers") {
		t.Errorf("the what-if is not labelled: router_replicas %d in the JSON, table:\n%s", doc3.RouterReplicas, stdout.String())
	}
	last := len(doc.Results) - 1 // approx-small
	if one, three := doc.Results[last]["pods_per_group"].(float64), doc3.Results[last]["pods_per_group"].(float64); one != 1 || !(three > 1) {
		t.Errorf("%v pods per group: %.2f with one picker, %.2f with three", doc.Results[last]["scheduler"], one, three)
	}
	for _, bad := range [][]string{{"--scenario", path, "--scale", "nope=2"}, {"--scenario", path, "--scale", "decode_itl_s=0"},
		{"--scenario", path, "--scale", "decode_itl_s"}, {"--scale", "decode_itl_s=2"}, {"--scenario", path, "--router-replicas", "0"}} {
		if err := Simulate(bad, nil, &stdout, &stderr); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestMainDispatch pins the command line: a flag first means simulate, a
// mistyped flag costs one line (not the flag list), --help is a success.
func TestMainDispatch(t *testing.T) {
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := Main(args, strings.NewReader(""), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	code, out, _ := run("--gen-workload", "--gen-groups", "4", "--pods", "2", "--routers", "random")
	if code != 0 || !strings.Contains(out, "random") {
		t.Errorf("default subcommand: %d %q", code, out)
	}
	code, _, errs := run("simulate", "--scenaro", "x.yaml")
	if code != 1 || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, "scenaro") || !strings.Contains(errs, "--help") {
		t.Errorf("typo: %d %q", code, errs)
	}
	if code, _, errs = run("replay", "--help"); code != 0 || !strings.Contains(errs, "-capacity") {
		t.Errorf("--help: %d %q", code, errs)
	}
	if code, out, _ = run("help"); code != 0 || !strings.Contains(out, "genworkload") {
		t.Errorf("help: %d %q", code, out)
	}
	if code, _, errs = run("simulat"); code != 2 || !strings.Contains(errs, "unknown subcommand") {
		t.Errorf("unknown: %d %q", code, errs)
	}
}

// simulateOut runs Simulate with args plus --out out (its table into
// stdout) and decodes the JSON report into v.
func simulateOut(t *testing.T, out string, v any, stdout *bytes.Buffer, args ...string) {
	t.Helper()
	var stderr bytes.Buffer
	if err := Simulate(append(args, "--out", out), nil, stdout, &stderr); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, stderr.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

func TestSimulatePDCommand(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	args := []string{"--pd", "--multi-turn", "--mt-conversations", "15", "--capacity", "2000", "--markdown",
		"--out", filepath.Join(dir, "pd.json")}
	if err := Simulate(args, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, r := range sim.PDRouterOrder {
		if !strings.Contains(out.String(), "| "+r+" |") {
			t.Fatalf("no %s row:\n%s", r, out.String())
		}
	}
	var rep sim.PDReport
	f, _ := os.ReadFile(filepath.Join(dir, "pd.json"))
	if err := json.Unmarshal(f, &rep); err != nil || len(rep.Results) != 4 || rep.Results[2].Router != sim.PDPrecise ||
		rep.Config.PrefillPods != 4 {
		t.Fatalf("json: %v %+v", err, rep)
	}
	out.Reset()
	if err := Simulate([]string{"--pd", "--multi-turn", "--mt-conversations", "5", "--capacity", "2000", "--pd-routers", "pd-load",
		"--pd-sensitivity"}, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "| transfer_per_block x0.5 |") || !strings.Contains(out.String(), "| max_local_prefill_tokens x2 |") {
		t.Fatalf("sensitivity table:\n%s", out.String())
	}
	for _, bad := range [][]string{
		{"--pd", "--multi-turn", "--gen-workload"},
		{"--pd", "--multi-turn", "--capacity", "2000", "--pd-routers", "nope"},
		{"--pd", "--multi-turn", "--capacity", "2000", "--decode-pods", "0"},
		{"--pd", "--multi-turn", "--mt-rate", "0"},
	} {
		if err := Simulate(bad, nil, io.Discard, io.Discard); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}
