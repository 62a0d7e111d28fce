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
	var args []string
	kinds := map[string]int{}
	for {
		var doc struct {
			Kind     string                `yaml:"kind"`
			Metadata struct{ Name string } `yaml:"metadata"`
			Data     map[string]string     `yaml:"data"`
			Spec     struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Args []string `yaml:"args"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
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
		if doc.Kind == "Deployment" && len(doc.Spec.Template.Spec.Containers) > 0 {
			args = doc.Spec.Template.Spec.Containers[0].Args
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

	// The container's flags load too, with the config: the default two
	// replicas recover from each other (--peer-selector and the token
	// file from the peer Secret).
	if len(args) < 2 || args[0] != "serve" {
		t.Fatalf("the Deployment's args %q do not start with serve", args)
	}
	flags := []string{"--config", file}
	for _, a := range args[1:] {
		if !strings.HasPrefix(a, "--config=") {
			flags = append(flags, a)
		}
	}
	cfg, err = loadConfig(flags, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatalf("the chart's flags are rejected: %v\n%q", err, flags)
	}
	if cfg.PeerSelector != "app.kubernetes.io/instance=kvindexd,app.kubernetes.io/name=kvindexd" || cfg.PeerPort != 8080 ||
		cfg.PeerTokenFile != "/etc/kvindexd-peer/peer-token" {
		t.Errorf("the chart's peer recovery flags load as selector %q port %d token file %q", cfg.PeerSelector, cfg.PeerPort, cfg.PeerTokenFile)
	}
}
