package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The committed references are what `make docs` writes now: a new flag, a
// changed default or help text, or a new metric without regenerating fails
// here.
func TestGeneratedDocsAreCurrent(t *testing.T) {
	for _, g := range generatedDocs {
		path := filepath.Join("..", "..", "docs", g.file)
		have, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		gen, err := g.gen()
		if err != nil {
			t.Fatalf("%s: %v", g.file, err)
		}
		want, err := spliceGenerated(have, gen)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if bytes.Equal(have, want) {
			continue
		}
		hl, wl := strings.Split(string(have), "\n"), strings.Split(string(want), "\n")
		i := 0
		for i < len(hl) && i < len(wl) && hl[i] == wl[i] {
			i++
		}
		line := func(ls []string) string {
			if i < len(ls) {
				return ls[i]
			}
			return "(end of file)"
		}
		t.Errorf("docs/%s is stale: run %s\nfirst difference, line %d:\n have %s\n want %s", g.file, regenerate, i+1, line(hl), line(wl))
	}
}

// Only the text between the markers is replaced; a file without them is
// refused rather than overwritten.
func TestSpliceGenerated(t *testing.T) {
	doc := "# Title\n\nintro\n\n" + genBegin + "\nold table\n" + genEnd + "\n\nafter\n"
	got, err := spliceGenerated([]byte(doc), "new table\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# Title\n\nintro\n\n" + genBegin + "\n\nnew table\n\n" + genEnd + "\n\nafter\n"; string(got) != want {
		t.Errorf("spliced:\n%s\nwant:\n%s", got, want)
	}
	if _, err := spliceGenerated([]byte("# Title\n\nno markers\n"), "x"); err == nil {
		t.Error("a file without markers was accepted")
	}
}

// Every family a daemon under traffic exports (events applied from a
// fleet, streams, sampled predictions, scores) is in the reference with the
// type it really has: the types the generator could only infer from the
// names of custom collectors with nothing to report are checked here.
func TestMetricsReferenceTypes(t *testing.T) {
	docs, err := metricDocs()
	if err != nil {
		t.Fatal(err)
	}
	// Every prompt score sampled: the prediction series appear at once.
	e := startInProcess(t, func(c *Config) {
		c.Tokenizers = map[string]string{fleetModel: qwen3Dir}
		c.PredictionSampleRate = 1
	})
	ids := make([]uint32, 8*e2eBlock)
	for i := range ids {
		ids[i] = uint32(i + 1)
	}
	publishFleet(t, e, ids)
	if code, body := e.do("POST", "/v1/score", `{"model":"`+fleetModel+`","prompt":"`+fleetPrompt+`"}`); code != 200 {
		t.Fatalf("prompt score: %d %s", code, body)
	}
	fams, err := e.d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range fams {
		name := f.GetName()
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		d, ok := docs[name]
		if !ok {
			t.Errorf("%s is exported but not in docs/metrics.md", name)
			continue
		}
		if typ := strings.ToLower(f.GetType().String()); d.typ != typ {
			t.Errorf("%s: reference says %s, the daemon exports a %s", name, d.typ, typ)
		}
		checked++
	}
	// The families that need traffic to appear at all.
	for _, name := range []string{"kvindexd_pod_events_applied_total", "kvindexd_pod_last_event_timestamp_seconds",
		"kvindexd_stream_last_seq", "kvindexd_stream_batches_total", "kvindexd_endpoint_connected",
		"kvindexd_prediction_blocks_predicted_total", "kvindexd_prediction_blocks_missed_total"} {
		found := false
		for _, f := range fams {
			found = found || f.GetName() == name
		}
		if !found {
			t.Errorf("%s not exported under traffic: the type check did not cover it", name)
		}
	}
	t.Logf("%d exported families checked against %d documented", checked, len(docs))
}
