package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestChatTemplateAndPredictionConfig(t *testing.T) {
	dir := t.TempDir()
	tmpl := filepath.Join(dir, "t.jinja")
	if err := os.WriteFile(tmpl, []byte("{{ messages[0].content }}"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "kvindex.yaml")
	tokDir, err := filepath.Abs("../../tokenization/testdata/qwen3") // tokenizer paths are checked at start
	if err != nil {
		t.Fatal(err)
	}
	yaml := "models:\n  m:\n    tokenizer: " + tokDir + "\n    chat_template: " + tmpl + "\nprediction_sample_rate: 0.5\nprediction_window: 2m\nprediction_capacity: 100\n"
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	noEnv := func(string) string { return "" }
	cfg, err := loadConfig([]string{"--config", file}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	pc := cfg.predictionConfig()
	if cfg.Models["m"].ChatTemplate != tmpl || pc.SampleRate != 0.5 || pc.Window != 2*time.Minute || pc.Capacity != 100 {
		t.Fatalf("cfg %+v, prediction %+v", cfg.Models, pc)
	}
	def, err := loadConfig(nil, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if pc := def.predictionConfig(); pc.SampleRate != 0.01 || pc.Window != 30*time.Second {
		t.Fatalf("defaults %+v", pc)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--prediction-sample-rate", "1.5"}, "prediction-sample-rate"},
		{[]string{"--prediction-window", "soon"}, "prediction-window"},
		{[]string{"--prediction-window", "-1s"}, "prediction-window"},
		{[]string{"--prediction-capacity", "-1"}, "prediction-capacity"},
	} {
		if _, err := loadConfig(c.args, noEnv, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v", c.args, err)
		}
	}
	missing := filepath.Join(dir, "missing.yaml")
	if err := os.WriteFile(missing, []byte("models:\n  m:\n    chat_template: "+filepath.Join(dir, "nope.jinja")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig([]string{"--config", missing}, noEnv, io.Discard); err == nil || !strings.Contains(err.Error(), "models[m].chat_template") {
		t.Errorf("missing template file: %v", err)
	}
}
