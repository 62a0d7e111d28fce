package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Peer recovery (kvindexd --peers) needs the HTTP base URLs of the other
// replicas. In Kubernetes they are the pods of the daemon's own workload:
// PeerURLs lists them once, when the daemon starts, through the same pods
// client engine discovery uses. A list, not a watch: recovery happens once,
// before the daemon subscribes to anything, and a replica that is not Ready
// at that moment has nothing to give.

// MaxPeers bounds the peers PeerURLs returns: each is tried in turn within
// one --peer-timeout, so a longer list only adds replicas never reached.
const MaxPeers = 16

// PeerConfig says how to find the daemon's peers.
type PeerConfig struct {
	// Namespace of the replicas (required: a workload lives in one).
	Namespace string
	// Selector is the label selector of the replicas (the workload's pod
	// selector), e.g. "app.kubernetes.io/name=kvindexd".
	Selector string
	// Port is the replicas' HTTP port.
	Port int
	// Self is this daemon's pod name (its hostname in a pod), left out.
	Self string
	// HTTPS asks the peers over https (they serve TLS).
	HTTPS bool
}

// CheckPeerConfig reports what makes cfg unusable, without a cluster.
func CheckPeerConfig(cfg PeerConfig) error {
	switch {
	case cfg.Namespace == "":
		return errors.New("peer discovery: the replicas' namespace is required")
	case strings.TrimSpace(cfg.Selector) == "":
		return errors.New("peer discovery: a label selector of the replicas is required")
	case cfg.Port < 1 || cfg.Port > 65535:
		return fmt.Errorf("peer discovery: port %d outside 1..65535", cfg.Port)
	}
	if _, err := labels.Parse(cfg.Selector); err != nil {
		return fmt.Errorf("peer discovery: label selector %q: %w", cfg.Selector, err)
	}
	return nil
}

// PeerURLs lists the HTTP base URLs of the Ready pods matching cfg other
// than cfg.Self, the longest-running first (the likeliest to hold a
// complete index), at most MaxPeers. None is not an error: the first
// replica of a workload has no peer.
func PeerURLs(ctx context.Context, client corev1client.PodsGetter, cfg PeerConfig) ([]string, error) {
	if err := CheckPeerConfig(cfg); err != nil {
		return nil, err
	}
	list, err := client.Pods(cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: cfg.Selector})
	if err != nil {
		return nil, fmt.Errorf("peer discovery: list pods %q in %s: %w", cfg.Selector, cfg.Namespace, err)
	}
	pods := list.Items
	slices.SortStableFunc(pods, func(a, b corev1.Pod) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	scheme := "http://"
	if cfg.HTTPS {
		scheme = "https://"
	}
	var out []string
	for i := range pods {
		p := &pods[i]
		if p.Name == cfg.Self || p.DeletionTimestamp != nil || p.Status.PodIP == "" || !podReady(p) {
			continue
		}
		out = append(out, scheme+net.JoinHostPort(p.Status.PodIP, strconv.Itoa(cfg.Port)))
		if len(out) == MaxPeers {
			break
		}
	}
	return out, nil
}
