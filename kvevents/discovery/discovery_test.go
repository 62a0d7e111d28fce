package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents"
)

// recorder is a Subscriber that keeps the subscribed endpoints and the
// order of calls.
type recorder struct {
	mu      sync.Mutex
	eps     map[string]kvevents.EndpointConfig
	log     []string
	failAdd map[string]bool
}

func newRecorder() *recorder {
	return &recorder{eps: map[string]kvevents.EndpointConfig{}, failAdd: map[string]bool{}}
}

func (r *recorder) AddEndpoint(ep kvevents.EndpointConfig) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failAdd[ep.Address] {
		return fmt.Errorf("refused %s", ep.Address)
	}
	if _, dup := r.eps[ep.Address]; dup {
		return fmt.Errorf("endpoint %q already added", ep.Address)
	}
	r.eps[ep.Address] = ep
	r.log = append(r.log, "add "+ep.Address)
	return nil
}

func (r *recorder) RemoveEndpoint(addr string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.eps[addr]; !ok {
		return fmt.Errorf("%q: %w", addr, kvevents.ErrUnknownEndpoint)
	}
	delete(r.eps, addr)
	r.log = append(r.log, "remove "+addr)
	return nil
}

// state renders the subscribed endpoints, sorted: "address pod=.. model=.. replay=.. engine=..".
func (r *recorder) state() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, ep := range r.eps {
		s := ep.Address + " pod=" + ep.Pod + " model=" + ep.Model
		if ep.ReplayAddress != "" {
			s += " replay=" + ep.ReplayAddress
		}
		if ep.Engine != blockkeys.EngineVLLM {
			s += " engine=" + ep.Engine.String()
		}
		if ep.Role != "" {
			s += " role=" + ep.Role
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

func (r *recorder) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

func (r *recorder) waitState(t *testing.T, what, want string) {
	t.Helper()
	wait.Until(t, what, func() string {
		if got := r.state(); got != want {
			return fmt.Sprintf("subscribed endpoints\n%s\nwant\n%s", got, want)
		}
		return ""
	})
}

// fakePods is the fake clientset's pods client. Like the fake clientset it
// tells the reflector it cannot stream lists through a watch.
type fakePods struct{ *fake.Clientset }

func (f fakePods) Pods(ns string) corev1client.PodInterface { return f.CoreV1().Pods(ns) }

type podOpt func(*corev1.Pod)

func ready(ok bool) podOpt {
	return func(p *corev1.Pod) {
		st := corev1.ConditionFalse
		if ok {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	}
}

func annotate(kv ...string) podOpt {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		for i := 0; i < len(kv); i += 2 {
			p.Annotations[kv[i]] = kv[i+1]
		}
	}
}

func label(k, v string) podOpt { return func(p *corev1.Pod) { p.Labels[k] = v } }

func newPod(ns, name, ip string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "-" + name + "-" + ip),
			Labels: map[string]string{"app": "vllm", "kvindex.io/model": "Qwen/Qwen3-8B"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
	}
	ready(true)(p)
	for _, o := range opts {
		o(p)
	}
	return p
}

type fixture struct {
	t      *testing.T
	client *fake.Clientset
	rec    *recorder
	d      *Discoverer
	reg    *prometheus.Registry
}

func start(t *testing.T, cfg Config, objs ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{t: t, client: fake.NewClientset(objs...), rec: newRecorder(), reg: prometheus.NewRegistry()}
	return f.run(cfg)
}

func (f *fixture) run(cfg Config) *fixture {
	t := f.t
	if cfg.Selector == "" {
		cfg.Selector = "app=vllm"
	}
	d, err := New(cfg, fakePods{f.client}, f.rec, f.reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	f.d = d
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	wait.For(t, "the informers synced", d.Synced)
	return f
}

func (f *fixture) create(p *corev1.Pod) {
	f.t.Helper()
	if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) update(p *corev1.Pod) {
	f.t.Helper()
	if _, err := f.client.CoreV1().Pods(p.Namespace).Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) delete(p *corev1.Pod) {
	f.t.Helper()
	if err := f.client.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func TestLifecycle(t *testing.T) {
	f := start(t, Config{Namespaces: []string{"llm"}})
	// Not Ready yet: nothing to subscribe to.
	a := newPod("llm", "a", "10.0.0.7", ready(false))
	f.create(a)
	other := newPod("other", "x", "10.0.9.9") // namespace not watched
	f.create(other)
	unlabeled := newPod("llm", "web", "10.0.0.50", label("app", "web"))
	f.create(unlabeled)
	b := newPod("llm", "b", "10.0.0.8")
	f.create(b)
	f.rec.waitState(t, "only the Ready matching pod",
		"tcp://10.0.0.8:5557 pod=10.0.0.8:8000 model=Qwen/Qwen3-8B")

	ready(true)(a)
	f.update(a)
	f.rec.waitState(t, "a became Ready",
		"tcp://10.0.0.7:5557 pod=10.0.0.7:8000 model=Qwen/Qwen3-8B\n"+
			"tcp://10.0.0.8:5557 pod=10.0.0.8:8000 model=Qwen/Qwen3-8B")

	ready(false)(b)
	f.update(b)
	f.rec.waitState(t, "b not Ready any more",
		"tcp://10.0.0.7:5557 pod=10.0.0.7:8000 model=Qwen/Qwen3-8B")

	ready(true)(b)
	f.update(b)
	f.rec.waitState(t, "b Ready again",
		"tcp://10.0.0.7:5557 pod=10.0.0.7:8000 model=Qwen/Qwen3-8B\n"+
			"tcp://10.0.0.8:5557 pod=10.0.0.8:8000 model=Qwen/Qwen3-8B")

	// Relabel: a new model re-subscribes under it; leaving the selector
	// unsubscribes.
	label("kvindex.io/model", "meta-llama/Llama-3.1-8B")(a)
	f.update(a)
	f.rec.waitState(t, "a relabeled to another model",
		"tcp://10.0.0.7:5557 pod=10.0.0.7:8000 model=meta-llama/Llama-3.1-8B\n"+
			"tcp://10.0.0.8:5557 pod=10.0.0.8:8000 model=Qwen/Qwen3-8B")
	label("app", "retired")(a)
	f.update(a)
	f.rec.waitState(t, "a no longer matches the selector",
		"tcp://10.0.0.8:5557 pod=10.0.0.8:8000 model=Qwen/Qwen3-8B")

	f.delete(b)
	f.rec.waitState(t, "b deleted", "")
	if n := f.d.Pods(); n != 0 {
		t.Fatalf("Pods() = %d after every pod left", n)
	}
	want := []string{
		"add tcp://10.0.0.8:5557", "add tcp://10.0.0.7:5557", "remove tcp://10.0.0.8:5557", "add tcp://10.0.0.8:5557",
		"remove tcp://10.0.0.7:5557", "add tcp://10.0.0.7:5557", "remove tcp://10.0.0.7:5557", "remove tcp://10.0.0.8:5557",
	}
	if got := f.rec.calls(); !slices.Equal(got, want) {
		t.Fatalf("subscriber calls\n%q\nwant\n%q", got, want)
	}
	if got := testutil.ToFloat64(f.d.metrics.changes.WithLabelValues("remove")); got != 4 {
		t.Fatalf("remove changes = %v, want 4", got)
	}
}

func TestAnnotationsRanksAndNaming(t *testing.T) {
	dp := newPod("llm", "dp", "10.0.0.9", annotate(AnnotationZMQPort, "6000", AnnotationReplayPort, "7000",
		AnnotationDPSize, "2", AnnotationServePort, "9000", AnnotationEngine, "sglang", "kvindex.io/model", "from-annotation"))
	v6 := newPod("llm", "v6", "fd00::5")
	bad := newPod("llm", "bad", "10.0.0.10", annotate(AnnotationDPSize, "lots"))
	f := start(t, Config{Namespaces: []string{"llm"}, ReplayPort: 5558, PodName: "{{.Namespace}}/{{.Name}}:{{.ServePort}}"}, dp, v6, bad)
	f.rec.waitState(t, "annotated pods",
		"tcp://10.0.0.9:6000 pod=llm/dp:9000 model=from-annotation replay=tcp://10.0.0.9:7000 engine=sglang\n"+
			"tcp://10.0.0.9:6001 pod=llm/dp:9000 model=from-annotation replay=tcp://10.0.0.9:7001 engine=sglang\n"+
			"tcp://[fd00::5]:5557 pod=llm/v6:8000 model=Qwen/Qwen3-8B replay=tcp://[fd00::5]:5558")
	if got := testutil.ToFloat64(f.d.metrics.skipped.WithLabelValues("invalid")); got < 1 {
		t.Fatalf("the pod with a bad annotation was not counted as skipped (%v)", got)
	}
	// Fixing the annotation subscribes the pod.
	annotate(AnnotationDPSize, "1")(bad)
	f.update(bad)
	f.rec.waitState(t, "bad pod fixed",
		"tcp://10.0.0.10:5557 pod=llm/bad:8000 model=Qwen/Qwen3-8B replay=tcp://10.0.0.10:5558\n"+
			"tcp://10.0.0.9:6000 pod=llm/dp:9000 model=from-annotation replay=tcp://10.0.0.9:7000 engine=sglang\n"+
			"tcp://10.0.0.9:6001 pod=llm/dp:9000 model=from-annotation replay=tcp://10.0.0.9:7001 engine=sglang\n"+
			"tcp://[fd00::5]:5557 pod=llm/v6:8000 model=Qwen/Qwen3-8B replay=tcp://[fd00::5]:5558")
	// Shrinking the DP size drops rank 1's endpoint only.
	annotate(AnnotationDPSize, "1")(dp)
	f.update(dp)
	f.rec.waitState(t, "dp shrunk",
		"tcp://10.0.0.10:5557 pod=llm/bad:8000 model=Qwen/Qwen3-8B replay=tcp://10.0.0.10:5558\n"+
			"tcp://10.0.0.9:6000 pod=llm/dp:9000 model=from-annotation replay=tcp://10.0.0.9:7000 engine=sglang\n"+
			"tcp://[fd00::5]:5557 pod=llm/v6:8000 model=Qwen/Qwen3-8B replay=tcp://[fd00::5]:5558")
}

func TestSeveralNamespacesAndReusedIP(t *testing.T) {
	f := start(t, Config{Namespaces: []string{"a", "b"}})
	old := newPod("a", "old", "10.0.0.7")
	f.create(old)
	f.create(newPod("b", "y", "10.0.1.1"))
	f.rec.waitState(t, "two namespaces",
		"tcp://10.0.0.7:5557 pod=10.0.0.7:8000 model=Qwen/Qwen3-8B\n"+
			"tcp://10.0.1.1:5557 pod=10.0.1.1:8000 model=Qwen/Qwen3-8B")
	// A new pod gets old's IP before old's deletion is seen: the address
	// changes hands (old's streams cleared, then resubscribed for the new
	// pod), and old's later deletion must not unsubscribe the new pod.
	reuse := newPod("b", "new", "10.0.0.7", label("kvindex.io/model", "m2"))
	f.create(reuse)
	f.rec.waitState(t, "address reused",
		"tcp://10.0.0.7:5557 pod=10.0.0.7:8000 model=m2\n"+
			"tcp://10.0.1.1:5557 pod=10.0.1.1:8000 model=Qwen/Qwen3-8B")
	f.delete(old)
	time.Sleep(100 * time.Millisecond) // a wrong removal would land by now
	f.rec.waitState(t, "old deleted after its address moved",
		"tcp://10.0.0.7:5557 pod=10.0.0.7:8000 model=m2\n"+
			"tcp://10.0.1.1:5557 pod=10.0.1.1:8000 model=Qwen/Qwen3-8B")
}

func TestMaxPodsAndFailedAddRetriedOnResync(t *testing.T) {
	f := &fixture{t: t, client: fake.NewClientset(), rec: newRecorder(), reg: prometheus.NewRegistry()}
	f.rec.failAdd["tcp://10.0.0.3:5557"] = true
	f.run(Config{Namespaces: []string{"llm"}, MaxPods: 2, Resync: 50 * time.Millisecond})
	f.create(newPod("llm", "p1", "10.0.0.1"))
	f.create(newPod("llm", "p2", "10.0.0.2"))
	f.rec.waitState(t, "two pods",
		"tcp://10.0.0.1:5557 pod=10.0.0.1:8000 model=Qwen/Qwen3-8B\n"+
			"tcp://10.0.0.2:5557 pod=10.0.0.2:8000 model=Qwen/Qwen3-8B")
	f.create(newPod("llm", "p3", "10.0.0.3"))
	wait.For(t, "the pod over the limit counted", func() bool { return testutil.ToFloat64(f.d.metrics.skipped.WithLabelValues("max_pods")) != 0 })
	// Room again: p3 is subscribed by a resync, but its first add fails
	// and must be retried by the next one.
	p1, _ := f.client.CoreV1().Pods("llm").Get(context.Background(), "p1", metav1.GetOptions{})
	f.delete(p1)
	wait.For(t, "the failing add attempted", func() bool { return testutil.ToFloat64(f.d.metrics.errors.WithLabelValues("add")) != 0 })
	f.rec.mu.Lock()
	delete(f.rec.failAdd, "tcp://10.0.0.3:5557")
	f.rec.mu.Unlock()
	f.rec.waitState(t, "p3 subscribed on a later resync",
		"tcp://10.0.0.2:5557 pod=10.0.0.2:8000 model=Qwen/Qwen3-8B\n"+
			"tcp://10.0.0.3:5557 pod=10.0.0.3:8000 model=Qwen/Qwen3-8B")
	if got := testutil.ToFloat64(f.d.metrics.errors.WithLabelValues("add")); got < 1 {
		t.Fatalf("add errors = %v", got)
	}
	if got := testutil.CollectAndCount(f.reg, "kvindexd_discovery_pods"); got != 1 {
		t.Fatalf("kvindexd_discovery_pods series = %d", got)
	}
}

// TestRelistAfterLostWatch plays an API-server restart: the watch ends
// and, while it is down, one pod is deleted, one stops being Ready and one
// is created. The informer relists, and discovery converges to the new
// state (deletions arrive as tombstones).
func TestRelistAfterLostWatch(t *testing.T) {
	a, b, c := newPod("llm", "a", "10.0.0.1"), newPod("llm", "b", "10.0.0.2"), newPod("llm", "c", "10.0.0.3")
	client := fake.NewClientset(a, b, c)
	var mu sync.Mutex
	var watchers []*watch.FakeWatcher
	expired := false
	// Every watch is one the test controls; changes made through the
	// clientset reach the informer only through a relist. A restarted API
	// server that compacted away the informer's resource version answers
	// its re-watch with 410 Gone, which makes the informer list again.
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		mu.Lock()
		defer mu.Unlock()
		if expired {
			expired = false
			return true, nil, apierrors.NewResourceExpired("resource version too old")
		}
		w := watch.NewFake()
		watchers = append(watchers, w)
		return true, w, nil
	})
	f := (&fixture{t: t, client: client, rec: newRecorder(), reg: prometheus.NewRegistry()}).run(Config{Namespaces: []string{"llm"}})
	f.rec.waitState(t, "initial list",
		"tcp://10.0.0.1:5557 pod=10.0.0.1:8000 model=Qwen/Qwen3-8B\n"+
			"tcp://10.0.0.2:5557 pod=10.0.0.2:8000 model=Qwen/Qwen3-8B\n"+
			"tcp://10.0.0.3:5557 pod=10.0.0.3:8000 model=Qwen/Qwen3-8B")

	f.delete(a)
	ready(false)(b)
	f.update(b)
	f.create(newPod("llm", "d", "10.0.0.4"))
	if got := f.rec.state(); !strings.Contains(got, "10.0.0.1") {
		t.Fatalf("a change reached the informer without a watch event: %s", got)
	}
	mu.Lock()
	expired = true
	watchers[len(watchers)-1].Stop() // the API server went away
	mu.Unlock()
	f.rec.waitState(t, "after the relist",
		"tcp://10.0.0.3:5557 pod=10.0.0.3:8000 model=Qwen/Qwen3-8B\n"+
			"tcp://10.0.0.4:5557 pod=10.0.0.4:8000 model=Qwen/Qwen3-8B")
}

func TestConfigErrors(t *testing.T) {
	client, rec := fake.NewClientset(), newRecorder()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "label selector is required"},
		{Config{Selector: "app in ("}, "label selector"},
		{Config{Selector: "a=b", PodName: "{{.Nope}}"}, "pod name template"},
		{Config{Selector: "a=b", PodName: "{{"}, "pod name template"},
		{Config{Selector: "a=b", ZMQPort: 70000}, "--discover-zmq-port 70000: out of range 1..65535"},
		{Config{Selector: "a=b", DPSize: -1}, "--discover-dp-size -1: out of range"},
	} {
		_, err := New(tc.cfg, fakePods{client}, rec, nil, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
		}
		if err := Validate(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
	if err := Validate(Config{Selector: "app=vllm"}); err != nil {
		t.Errorf("Validate with defaults: %v", err)
	}
	if _, err := New(Config{Selector: "a=b"}, nil, rec, nil, nil); err == nil {
		t.Error("New without a client succeeded")
	}
}

func TestSlimPodKeepsWhatReconcileReads(t *testing.T) {
	p := newPod("llm", "a", "10.0.0.1", annotate(AnnotationZMQPort, "6000"))
	p.Spec.Containers = []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	slim, err := slimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	sp := slim.(*corev1.Pod)
	if len(sp.Spec.Containers) != 0 || len(sp.ManagedFields) != 0 {
		t.Fatal("slimPod kept spec or managed fields")
	}
	d, err := New(Config{Selector: "app=vllm"}, fakePods{fake.NewClientset()}, newRecorder(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	full, err := d.wanted(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.wanted(sp)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(full) != fmt.Sprint(got) || len(got) != 1 {
		t.Fatalf("wanted(slim) = %v, wanted(full) = %v", got, full)
	}
	tomb := "not a pod"
	if out, _ := slimPod(tomb); out != tomb {
		t.Fatal("slimPod changed a non-pod")
	}
}

// TestRoleLabel: the P/D role comes from llm-d's label by default (its
// "prefill-decode" shown as "both", an unknown value as it is), from the
// configured label otherwise; a pod without it has none.
func TestRoleLabel(t *testing.T) {
	pf := newPod("llm", "pf", "10.0.1.1", label("llm-d.ai/role", "prefill"))
	pd := newPod("llm", "pd", "10.0.1.2", label("llm-d.ai/role", "prefill-decode"))
	odd := newPod("llm", "odd", "10.0.1.3", label("llm-d.ai/role", "router"))
	none := newPod("llm", "none", "10.0.1.4", label("tier", "decode"))
	f := start(t, Config{Namespaces: []string{"llm"}, PodName: "{{.Name}}"}, pf, pd, odd, none)
	f.rec.waitState(t, "roles from llm-d.ai/role",
		"tcp://10.0.1.1:5557 pod=pf model=Qwen/Qwen3-8B role=prefill\n"+
			"tcp://10.0.1.2:5557 pod=pd model=Qwen/Qwen3-8B role=both\n"+
			"tcp://10.0.1.3:5557 pod=odd model=Qwen/Qwen3-8B role=router\n"+
			"tcp://10.0.1.4:5557 pod=none model=Qwen/Qwen3-8B")
	g := start(t, Config{Namespaces: []string{"llm"}, PodName: "{{.Name}}", RoleLabel: "tier"}, none)
	g.rec.waitState(t, "role from a configured label", "tcp://10.0.1.4:5557 pod=none model=Qwen/Qwen3-8B role=decode")
}
