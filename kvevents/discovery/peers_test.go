package discovery

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// The peers are the Ready replicas matching the selector in the namespace,
// without this daemon, a pod being deleted or one without an address; the
// longest-running first, at most MaxPeers.
func TestPeerURLs(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	replica := func(name, ip string, age int, opts ...podOpt) *corev1.Pod {
		p := newPod("kvindex", name, ip, opts...)
		p.Labels = map[string]string{"app.kubernetes.io/name": "kvindexd"}
		p.CreationTimestamp = metav1.NewTime(t0.Add(-time.Duration(age) * time.Minute))
		return p
	}
	deleting := func(p *corev1.Pod) { now := metav1.NewTime(t0); p.DeletionTimestamp = &now }
	other := newPod("kvindex", "vllm-0", "10.0.0.9") // an engine pod: another selector
	elsewhere := replica("kvindexd-x", "10.0.1.1", 50)
	elsewhere.Namespace = "other"
	objs := []runtime.Object{
		replica("kvindexd-b", "10.0.0.2", 10), replica("kvindexd-a", "10.0.0.1", 30),
		replica("kvindexd-self", "10.0.0.3", 40), replica("kvindexd-unready", "10.0.0.4", 60, ready(false)),
		replica("kvindexd-gone", "10.0.0.5", 70, deleting), replica("kvindexd-noip", "", 80), other, elsewhere,
	}
	client := fake.NewClientset(objs...)
	cfg := PeerConfig{Namespace: "kvindex", Selector: "app.kubernetes.io/name=kvindexd", Port: 8080, Self: "kvindexd-self"}
	got, err := PeerURLs(context.Background(), fakePods{client}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"http://10.0.0.1:8080", "http://10.0.0.2:8080"}; !slices.Equal(got, want) {
		t.Errorf("peers %v, want %v (Ready, not self, oldest first)", got, want)
	}
	cfg.HTTPS, cfg.Self = true, ""
	if got, _ := PeerURLs(context.Background(), fakePods{client}, cfg); len(got) != 3 || !strings.HasPrefix(got[0], "https://10.0.0.3:") {
		t.Errorf("with HTTPS and no self: %v, want the 3 Ready replicas over https, oldest first", got)
	}

	// The cap.
	var many []runtime.Object
	for i := range MaxPeers + 5 {
		many = append(many, replica(fmt.Sprintf("r-%02d", i), fmt.Sprintf("10.1.0.%d", i+1), 100-i))
	}
	got, err = PeerURLs(context.Background(), fakePods{fake.NewClientset(many...)}, PeerConfig{Namespace: "kvindex",
		Selector: "app.kubernetes.io/name=kvindexd", Port: 8080})
	if err != nil || len(got) != MaxPeers || got[0] != "http://10.1.0.1:8080" {
		t.Errorf("%d replicas: %v (err %v), want the %d oldest", MaxPeers+5, got, err, MaxPeers)
	}

	// No replica is not an error: the first one starts cold.
	if got, err := PeerURLs(context.Background(), fakePods{fake.NewClientset()}, cfg); err != nil || len(got) != 0 {
		t.Errorf("no replicas: %v, %v", got, err)
	}
}

func TestPeerConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  PeerConfig
		want string
	}{
		{PeerConfig{Selector: "a=b", Port: 1}, "namespace is required"},
		{PeerConfig{Namespace: "n", Port: 1}, "selector of the replicas is required"},
		{PeerConfig{Namespace: "n", Selector: "a=b"}, "port 0 outside"},
		{PeerConfig{Namespace: "n", Selector: "a in (", Port: 1}, "label selector"},
	} {
		_, err := PeerURLs(context.Background(), fakePods{fake.NewClientset()}, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.cfg, err, c.want)
		}
	}
}
