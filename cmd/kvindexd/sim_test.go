package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimSubcommandsRegistered(t *testing.T) {
	for _, n := range []string{"replay", "simulate", "genworkload"} {
		if sc, ok := subcommands[n]; !ok || sc.run == nil || !strings.Contains(sc.summary, "alias of kvsim") {
			t.Errorf("subcommand %q not registered as a kvsim alias", n)
		}
	}
}

// TestSimulateScenarioEndToEnd runs the alias `kvindexd simulate --scenario` on the
// committed small scenario and checks the JSON and SVG it writes.
func TestSimulateScenarioEndToEnd(t *testing.T) {
	dir := t.TempDir()
	out, svg := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.svg")
	var stdout, stderr bytes.Buffer
	args := []string{"--scenario", "../../sim/testdata/scenarios/small.yaml", "--out", out, "--svg", svg}
	if err := subcommands["simulate"].run(args, nil, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var doc struct {
		Results []struct {
			Scheduler        string  `json:"scheduler"`
			OutputTokensPerS float64 `json:"output_tokens_per_s"`
			RequestsPerS     float64 `json:"requests_per_s"`
			TTFTp90          float64 `json:"ttft_p90_s"`
			TTFTMean         float64 `json:"ttft_mean_s"`
			ITLMean          float64 `json:"itl_mean_s"`
			HitRate          float64 `json:"hit_rate"`
			Stages           []struct {
				Rate float64 `json:"rate"`
			} `json:"stages"`
		} `json:"results"`
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Results) != 6 || doc.Results[0].Scheduler != "precise" {
		t.Fatalf("results: %+v", doc.Results)
	}
	for _, r := range doc.Results {
		if !(r.OutputTokensPerS > 0 && r.RequestsPerS > 0 && r.TTFTp90 > 0 && r.ITLMean > 0 && r.HitRate > 0) ||
			len(r.Stages) != 3 {
			t.Errorf("%s: %+v", r.Scheduler, r)
		}
	}
	if !strings.Contains(stdout.String(), "precise") {
		t.Errorf("stdout: %s", stdout.String())
	}
	if s, err := os.ReadFile(svg); err != nil || !strings.Contains(string(s), "<polyline") {
		t.Errorf("svg: %v", err)
	}
}
