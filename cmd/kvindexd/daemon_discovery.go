package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/discovery"
)

// DiscoveryConfig is the `discovery:` block of the config file and the
// --discover-* flags: Kubernetes pods to subscribe to (package discovery).
type DiscoveryConfig struct {
	Enabled    bool     `json:"enabled" yaml:"enabled"`
	Namespaces []string `json:"namespaces" yaml:"namespaces"`
	Selector   string   `json:"selector" yaml:"selector"`
	ZMQPort    int      `json:"zmq_port" yaml:"zmq_port"`
	ReplayPort int      `json:"replay_port" yaml:"replay_port"`
	DPSize     int      `json:"dp_size" yaml:"dp_size"`
	ServePort  int      `json:"serve_port" yaml:"serve_port"`
	PodName    string   `json:"pod_name" yaml:"pod_name"`
	ModelKey   string   `json:"model_key" yaml:"model_key"`
	RoleLabel  string   `json:"role_label" yaml:"role_label"`
	Engine     string   `json:"engine" yaml:"engine"`
	Resync     Duration `json:"resync" yaml:"resync"`
	MaxPods    int      `json:"max_pods" yaml:"max_pods"`
	Kubeconfig string   `json:"kubeconfig" yaml:"kubeconfig"`
}

// defaultDiscoveryConfig is discovery.DefaultConfig in the daemon's shape.
func defaultDiscoveryConfig() DiscoveryConfig {
	d := discovery.DefaultConfig()
	return DiscoveryConfig{ZMQPort: d.ZMQPort, ReplayPort: d.ReplayPort, DPSize: d.DPSize, ServePort: d.ServePort,
		PodName: d.PodName, ModelKey: d.ModelKey, RoleLabel: d.RoleLabel, Engine: d.Engine.String(), Resync: Duration(d.Resync), MaxPods: d.MaxPods}
}

func discoveryFlags(fs *flag.FlagSet, c *DiscoveryConfig) {
	fs.BoolVar(&c.Enabled, "discover-pods", c.Enabled, "subscribe to the Ready engine pods Kubernetes lists (needs --discover-selector)")
	fs.Var(listFlag{&c.Namespaces}, "discover-namespace", "namespace to watch, repeatable or comma-separated (none = every namespace)")
	fs.StringVar(&c.Selector, "discover-selector", c.Selector, "label selector of the engine pods, e.g. app=vllm")
	o := &discovery.Options
	intOpt(fs, &c.ZMQPort, o.ZMQPort)
	intOpt(fs, &c.ReplayPort, o.ReplayPort)
	intOpt(fs, &c.DPSize, o.DPSize)
	intOpt(fs, &c.ServePort, o.ServePort)
	fs.StringVar(&c.PodName, "discover-pod-name", c.PodName, "template of a discovered pod's name: {{.IP}} {{.ServePort}} {{.ZMQPort}} {{.Name}} {{.Namespace}}")
	fs.StringVar(&c.ModelKey, "discover-model-key", c.ModelKey, "pod annotation or label holding the model name (absent: the topic's model)")
	fs.StringVar(&c.RoleLabel, "discover-role-label", c.RoleLabel, "pod label holding the pod's P/D role (llm-d's values: prefill, decode, both, prefill-decode, encode), shown in /v1/pods")
	fs.StringVar(&c.Engine, "discover-engine", c.Engine, "engine kind of discovered pods: vllm, sglang or trtllm; pod annotation "+discovery.AnnotationEngine)
	durationOpt(fs, &c.Resync, o.Resync)
	intOpt(fs, &c.MaxPods, o.MaxPods)
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig for --discover-pods outside a cluster (default: the in-cluster service account)")
}

// validateDiscovery checks the settings that need no cluster.
func (c *Config) validateDiscovery() error {
	d := c.Discovery
	if !d.Enabled {
		return nil
	}
	if d.Selector == "" {
		return errors.New("--discover-pods needs --discover-selector (the engine pods' labels, e.g. app=vllm)")
	}
	if c.Leases {
		// Leases divide a fixed endpoint list; every daemon would discover
		// every pod and apply its events once more.
		return errors.New("--discover-pods and --leases do not combine: with discovery, run one daemon per shared index, " +
			"or give each replica its own in-memory index")
	}
	if _, ok := blockkeys.ParseEngine(d.Engine); !ok {
		return fmt.Errorf("--discover-engine %q: want vllm, sglang or trtllm", d.Engine)
	}
	_, err := c.discoveryConfig()
	return err
}

func (c *Config) discoveryConfig() (discovery.Config, error) {
	d := c.Discovery
	eng, _ := blockkeys.ParseEngine(d.Engine)
	resync := time.Duration(d.Resync) // validated
	dc := discovery.Config{Namespaces: d.Namespaces, Selector: d.Selector, ZMQPort: d.ZMQPort, ReplayPort: d.ReplayPort,
		DPSize: d.DPSize, ServePort: d.ServePort, PodName: d.PodName, ModelKey: d.ModelKey, RoleLabel: d.RoleLabel, Engine: eng,
		Resync: resync, MaxPods: d.MaxPods}
	// New validates everything but the cluster connection; a fake client
	// suffices for that.
	return dc, discovery.Validate(dc)
}

// setupDiscovery builds the pod watcher over the daemon's subscriber.
func (d *daemon) setupDiscovery() error {
	dc, err := d.cfg.discoveryConfig()
	if err != nil {
		return err
	}
	// Empty kubeconfig: the in-cluster service account.
	rc, err := clientcmd.BuildConfigFromFlags("", d.cfg.Discovery.Kubeconfig)
	if err != nil {
		return fmt.Errorf("--discover-pods: Kubernetes client config: %w", err)
	}
	rc.UserAgent = "kvindexd"
	client, err := corev1client.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("--discover-pods: %w", err)
	}
	d.discovery, err = discovery.New(dc, client, d.idx.Subscriber(), d.reg, d.log.With("component", "discovery"))
	return err
}

// serviceAccountNamespace is where Kubernetes writes a pod's namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// discoverPeers lists the Ready replicas of --peer-selector (this pod left
// out) as peer URLs. It runs once, before the index is built: recovery
// copies one peer's index at start. Any failure is logged and means no
// discovered peers: the daemon starts cold, as when no peer answers.
func (c *Config) discoverPeers(ctx context.Context, log *slog.Logger) []string {
	if c.PeerSelector == "" {
		return nil
	}
	urls, err := c.listPeers(ctx)
	if err != nil {
		log.Warn("peer discovery failed: no peers from Kubernetes (cold start unless --peers answers)", "err", err)
		return nil
	}
	log.Info("peers discovered", "selector", c.PeerSelector, "peers", urls)
	return urls
}

func (c *Config) listPeers(ctx context.Context) ([]string, error) {
	pc := discovery.PeerConfig{Namespace: c.PeerNamespace, Selector: c.PeerSelector, Port: c.PeerPort, HTTPS: c.TLSCertFile != ""}
	if pc.Namespace == "" {
		b, err := os.ReadFile(serviceAccountNamespace)
		if err != nil {
			return nil, fmt.Errorf("--peer-selector needs --peer-namespace outside a pod: %w", err)
		}
		pc.Namespace = strings.TrimSpace(string(b))
	}
	if pc.Port == 0 {
		_, port, err := net.SplitHostPort(c.HTTPAddr)
		if pc.Port, _ = strconv.Atoi(port); err != nil || pc.Port == 0 {
			return nil, fmt.Errorf("--peer-selector needs --peer-port: --http-addr %q names no TCP port", c.HTTPAddr)
		}
	}
	var err error
	if pc.Self, err = os.Hostname(); err != nil { // a pod's hostname is its name
		return nil, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.Discovery.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("Kubernetes client config: %w", err)
	}
	rc.UserAgent = "kvindexd"
	client, err := corev1client.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, max(time.Duration(c.PeerTimeout), time.Second))
	defer cancel()
	return discovery.PeerURLs(ctx, client, pc)
}
