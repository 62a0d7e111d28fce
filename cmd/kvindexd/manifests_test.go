package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestRenderedManifestsConfigLoads checks the daemon accepts the config file
// the Helm chart renders (deploy/manifests is the chart with its defaults):
// unknown keys are start-up errors, so a chart value that names a key the
// daemon does not know would crash every pod.
func TestRenderedManifestsConfigLoads(t *testing.T) {
	data, err := os.ReadFile("../../deploy/manifests/kvindexd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var config string
	kinds := map[string]int{}
	for {
		var doc struct {
			Kind     string                `yaml:"kind"`
			Metadata struct{ Name string } `yaml:"metadata"`
			Data     map[string]string     `yaml:"data"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("deploy/manifests/kvindexd.yaml: %v", err)
		}
		kinds[doc.Kind]++
		if doc.Kind == "ConfigMap" {
			config = doc.Data["config.yaml"]
		}
	}
	for _, k := range []string{"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "ConfigMap",
		"PodDisruptionBudget", "NetworkPolicy"} {
		if kinds[k] == 0 {
			t.Errorf("the rendered manifests have no %s (kinds: %v)", k, kinds)
		}
	}
	if config == "" {
		t.Fatal("no ConfigMap with config.yaml in the rendered manifests")
	}
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig([]string{"--config", file}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatalf("the chart's config is rejected: %v\n%s", err, config)
	}
	if !cfg.Discovery.Enabled || cfg.Discovery.Selector != "app=vllm" || strings.Join(cfg.Discovery.Namespaces, ",") != "kvindex" ||
		cfg.HashSeed != "0" || cfg.HTTPAddr != ":8080" || !cfg.AllTopics {
		t.Fatalf("the chart's config loads as %+v", cfg)
	}
}
