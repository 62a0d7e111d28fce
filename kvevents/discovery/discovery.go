// Package discovery finds engine pods in Kubernetes and keeps the event
// subscriber connected to exactly the Ready ones: it watches pods matching a
// label selector in one or more namespaces with client-go informers,
// subscribes to each Ready pod's ZMQ publisher (one endpoint per
// data-parallel rank), and unsubscribes - which clears the pod from the
// index - when the pod is deleted, stops being Ready, stops matching the
// selector or changes address.
//
// Informers relist after a dropped watch (an API-server restart) and replay
// every pod on each resync, and every notification is handled by the same
// idempotent reconcile of one pod's wanted endpoints against the ones it has,
// so a missed notification is repaired by the next relist or resync.
//
// Only this package and the daemon's wiring import client-go.
package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/internal/option"
	"github.com/kvindex/kvindex/kvevents"
)

// Pod annotations that override the Config defaults for one pod.
const (
	AnnotationZMQPort    = "kvindex.io/zmq-port"    // port of DP rank 0's publisher
	AnnotationReplayPort = "kvindex.io/replay-port" // port of DP rank 0's replay endpoint; "0" = none
	AnnotationDPSize     = "kvindex.io/dp-size"     // data-parallel ranks; rank r uses port+r and replay-port+r
	AnnotationServePort  = "kvindex.io/serve-port"  // the port routers send requests to ({{.ServePort}})
	AnnotationEngine     = "kvindex.io/engine"      // vllm, sglang or trtllm
)

// Defaults for Config fields left zero.
const (
	DefaultZMQPort   = 5557
	DefaultServePort = 8000
	DefaultPodName   = "{{.IP}}:{{.ServePort}}"
	DefaultModelKey  = "kvindex.io/model"
	DefaultRoleLabel = "llm-d.ai/role"
	DefaultResync    = 5 * time.Minute
	DefaultMaxPods   = 4096
)

// Subscriber is the part of *kvevents.Subscriber discovery drives.
// RemoveEndpoint clears every pod that arrived through the endpoint.
type Subscriber interface {
	AddEndpoint(ep kvevents.EndpointConfig) error
	RemoveEndpoint(address string) error
}

// Config says which pods to watch and how to reach their publishers.
type Config struct {
	// Namespaces to watch; empty = every namespace (needs a ClusterRole).
	Namespaces []string
	// Selector is a label selector (required: watching every pod of a
	// cluster is never what is meant), e.g. "app=vllm,tier=prefill".
	Selector string
	// ZMQPort and ReplayPort are the publisher and replay ports of DP rank
	// 0 (ReplayPort 0 = no replay); rank r uses port + r. Pods override
	// them with annotations.
	ZMQPort, ReplayPort int
	// DPSize is the number of data-parallel ranks per pod (0 = 1).
	DPSize int
	// ServePort is the pod's request port, available to PodName as
	// {{.ServePort}}.
	ServePort int
	// PodName is a text/template of the name scores report for the pod:
	// fields .IP, .ServePort, .ZMQPort, .Name, .Namespace. Routers usually
	// call pods ip:port, the default.
	PodName string
	// ModelKey is the annotation, else label, holding the pod's model name;
	// a pod without it is indexed under the model its topic names.
	ModelKey string
	// RoleLabel is the pod label holding its P/D role (default
	// llm-d.ai/role, the label llm-d's router filters prefill and decode
	// pods by); its value is shown in the pod listing (EndpointConfig.Role):
	// a known value as routing.ParseRole reads it, any other as it is.
	RoleLabel string
	// Engine is the engine kind when the pod has no kvindex.io/engine
	// annotation (zero = vLLM).
	Engine blockkeys.Engine
	// Resync is how often every watched pod is reconciled again.
	Resync time.Duration
	// MaxPods caps the pods subscribed at once; more are skipped and
	// counted (kvindexd_discovery_skipped_total{reason="max_pods"}).
	MaxPods int
}

// podFields are what a PodName template can use.
type podFields struct {
	IP, Name, Namespace string
	ServePort, ZMQPort  int
}

// Discoverer keeps a Subscriber's endpoints equal to the Ready pods'.
type Discoverer struct {
	cfg      Config
	client   corev1client.PodsGetter
	sub      Subscriber
	log      *slog.Logger
	selector labels.Selector
	name     *template.Template
	metrics  *metrics

	mu sync.Mutex
	// pods holds the endpoints each pod is subscribed through (by UID);
	// owner says which pod an address belongs to.
	pods  map[types.UID]map[string]kvevents.EndpointConfig
	owner map[string]types.UID

	informers []cache.SharedIndexInformer
	synced    []cache.InformerSynced
}

// Validate checks cfg without a cluster (New does too).
func Validate(cfg Config) error {
	_, _, err := parse(cfg.withDefaults())
	return err
}

// parse checks cfg (defaults applied) and compiles its selector and name
// template.
func parse(cfg Config) (labels.Selector, *template.Template, error) {
	if strings.TrimSpace(cfg.Selector) == "" {
		return nil, nil, errors.New("discovery: a label selector is required (e.g. app=vllm)")
	}
	sel, err := labels.Parse(cfg.Selector)
	if err != nil {
		return nil, nil, fmt.Errorf("discovery: label selector %q: %w", cfg.Selector, err)
	}
	if err := checkRanges(cfg); err != nil {
		return nil, nil, err
	}
	tmpl, err := template.New("pod-name").Option("missingkey=error").Parse(cfg.PodName)
	if err != nil {
		return nil, nil, fmt.Errorf("discovery: pod name template %q: %w", cfg.PodName, err)
	}
	if _, err := render(tmpl, podFields{IP: "10.0.0.1", Name: "p", Namespace: "ns", ServePort: 1, ZMQPort: 2}); err != nil {
		return nil, nil, fmt.Errorf("discovery: pod name template %q: %w", cfg.PodName, err)
	}
	return sel, tmpl, nil
}

// New checks cfg and registers the discovery metrics on reg (nil = none).
// client is the core/v1 pods client (clientset.CoreV1()): discovery reads
// nothing else, and the typed core client alone keeps the other API groups'
// clients out of the binary.
func New(cfg Config, client corev1client.PodsGetter, sub Subscriber, reg prometheus.Registerer, log *slog.Logger) (*Discoverer, error) {
	if client == nil || sub == nil {
		return nil, errors.New("discovery: a Kubernetes client and a subscriber are required")
	}
	cfg = cfg.withDefaults()
	sel, tmpl, err := parse(cfg)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	d := &Discoverer{cfg: cfg, client: client, sub: sub, log: log, selector: sel, name: tmpl,
		pods: map[types.UID]map[string]kvevents.EndpointConfig{}, owner: map[string]types.UID{}}
	if d.metrics, err = newMetrics(reg, d); err != nil {
		return nil, err
	}
	namespaces := cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	seen := map[string]bool{}
	for _, ns := range namespaces {
		if seen[ns] {
			continue
		}
		seen[ns] = true
		// The wrapper lets a client that cannot stream lists through a watch
		// (client-go's fake) say so, as generated informers do.
		lw := cache.ToListWatcherWithWatchListSemantics(podListWatch(client.Pods(ns), sel.String()), client)
		inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, cfg.Resync, cache.Indexers{})
		// The cache keeps only what reconcile reads: a pod object is
		// mostly spec and managed fields discovery never looks at.
		if err := inf.SetTransform(slimPod); err != nil {
			return nil, fmt.Errorf("discovery: %w", err)
		}
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { d.onPod(obj) },
			UpdateFunc: func(_, obj any) { d.onPod(obj) },
			DeleteFunc: d.onDelete,
		})
		if err != nil {
			return nil, fmt.Errorf("discovery: %w", err)
		}
		d.informers = append(d.informers, inf)
		d.synced = append(d.synced, inf.HasSynced)
	}
	return d, nil
}

// Run watches until ctx is done. When it returns, the discovered endpoints
// stay subscribed: the daemon is shutting down and its subscriber with it.
func (d *Discoverer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, inf := range d.informers {
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
	if cache.WaitForCacheSync(ctx.Done(), d.synced...) {
		d.log.Info("discovery: initial pod list synced", "namespaces", d.cfg.Namespaces, "selector", d.cfg.Selector,
			"pods", d.Pods())
	}
	wg.Wait()
	return nil
}

// Synced reports whether every namespace's initial list was handled.
func (d *Discoverer) Synced() bool {
	for _, s := range d.synced {
		if !s() {
			return false
		}
	}
	return true
}

// Pods is the number of pods currently subscribed.
func (d *Discoverer) Pods() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.pods)
}

func (d *Discoverer) onPod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	want, err := d.wanted(pod)
	if err != nil {
		d.metrics.skipped.WithLabelValues("invalid").Inc()
		d.log.Warn("discovery: pod not subscribed", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
	d.reconcile(pod.UID, pod.Namespace+"/"+pod.Name, want)
}

func (d *Discoverer) onDelete(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		// Deleted while the watch was down: the relist noticed.
		obj = tomb.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		d.reconcile(pod.UID, pod.Namespace+"/"+pod.Name, nil)
	}
}

// wanted returns the endpoints pod should be subscribed through: none
// unless it matches the selector, is Ready, has an IP and is not being
// deleted.
func (d *Discoverer) wanted(pod *corev1.Pod) (map[string]kvevents.EndpointConfig, error) {
	if !d.selector.Matches(labels.Set(pod.Labels)) || pod.DeletionTimestamp != nil || pod.Status.PodIP == "" || !podReady(pod) {
		return nil, nil
	}
	zmqPort, err := annotationInt(pod, AnnotationZMQPort, d.cfg.ZMQPort, Options.ZMQPort)
	if err != nil {
		return nil, err
	}
	replayPort, err := annotationInt(pod, AnnotationReplayPort, d.cfg.ReplayPort, Options.ReplayPort)
	if err != nil {
		return nil, err
	}
	dpSize, err := annotationInt(pod, AnnotationDPSize, d.cfg.DPSize, Options.DPSize)
	if err != nil {
		return nil, err
	}
	servePort, err := annotationInt(pod, AnnotationServePort, d.cfg.ServePort, Options.ServePort)
	if err != nil {
		return nil, err
	}
	if zmqPort+dpSize-1 > 65535 || (replayPort != 0 && replayPort+dpSize-1 > 65535) {
		return nil, fmt.Errorf("%d DP ranks from port %d (replay %d) run past 65535", dpSize, zmqPort, replayPort)
	}
	engine := d.cfg.Engine
	if v, ok := pod.Annotations[AnnotationEngine]; ok {
		if engine, ok = blockkeys.ParseEngine(v); !ok {
			return nil, fmt.Errorf("annotation %s=%q: want vllm, sglang or trtllm", AnnotationEngine, v)
		}
	}
	model, ok := pod.Annotations[d.cfg.ModelKey]
	if !ok {
		model = pod.Labels[d.cfg.ModelKey]
	}
	role := pod.Labels[d.cfg.RoleLabel]
	if r, ok := routing.ParseRole(role); ok && role != "" {
		role = r.String() // "prefill-decode" shows as "both"
	}
	name, err := render(d.name, podFields{IP: pod.Status.PodIP, Name: pod.Name, Namespace: pod.Namespace,
		ServePort: servePort, ZMQPort: zmqPort})
	if err != nil {
		return nil, err
	}
	host := pod.Status.PodIP
	if strings.Contains(host, ":") {
		host = "[" + host + "]" // IPv6
	}
	out := make(map[string]kvevents.EndpointConfig, dpSize)
	for r := range dpSize {
		ep := kvevents.EndpointConfig{Address: "tcp://" + host + ":" + strconv.Itoa(zmqPort+r), Pod: name, Model: model, Engine: engine, Role: role}
		if replayPort != 0 {
			ep.ReplayAddress = "tcp://" + host + ":" + strconv.Itoa(replayPort+r)
		}
		out[ep.Address] = ep
	}
	return out, nil
}

// reconcile makes pod uid's subscriptions equal want (nil = none). It is
// idempotent: resyncs and relists call it again with the same state.
func (d *Discoverer) reconcile(uid types.UID, who string, want map[string]kvevents.EndpointConfig) {
	d.mu.Lock()
	defer d.mu.Unlock()
	have := d.pods[uid]
	if have == nil && len(want) > 0 && len(d.pods) >= d.cfg.MaxPods {
		d.metrics.skipped.WithLabelValues("max_pods").Inc()
		d.log.Warn("discovery: pod not subscribed: the pod limit is reached", "pod", who, "max_pods", d.cfg.MaxPods)
		return
	}
	for addr, ep := range have {
		if w, ok := want[addr]; ok && w == ep {
			continue
		}
		d.remove(uid, who, addr)
		delete(have, addr)
	}
	for addr, ep := range want {
		if _, ok := have[addr]; ok {
			continue
		}
		if prev, taken := d.owner[addr]; taken && prev != uid {
			// The address moved to a new pod (IPs are reused) before the
			// old pod's deletion arrived: that engine is gone.
			d.remove(prev, "previous owner", addr)
			delete(d.pods[prev], addr)
			if len(d.pods[prev]) == 0 {
				delete(d.pods, prev)
			}
		}
		if err := d.sub.AddEndpoint(ep); err != nil {
			// Not recorded as subscribed: the next resync tries again.
			d.metrics.errors.WithLabelValues("add").Inc()
			d.log.Warn("discovery: subscribe failed", "pod", who, "address", addr, "err", err)
			continue
		}
		if have == nil {
			have = map[string]kvevents.EndpointConfig{}
			d.pods[uid] = have
		}
		have[addr] = ep
		d.owner[addr] = uid
		d.metrics.changes.WithLabelValues("add").Inc()
		d.log.Info("discovery: subscribed", "pod", who, "address", addr, "name", ep.Pod, "model", ep.Model, "replay", ep.ReplayAddress)
	}
	if have != nil && len(have) == 0 {
		delete(d.pods, uid)
	}
}

// remove unsubscribes addr; d.mu is held.
func (d *Discoverer) remove(uid types.UID, who, addr string) {
	if d.owner[addr] == uid {
		delete(d.owner, addr)
	}
	d.metrics.changes.WithLabelValues("remove").Inc()
	if err := d.sub.RemoveEndpoint(addr); err != nil && !errors.Is(err, kvevents.ErrUnknownEndpoint) {
		d.metrics.errors.WithLabelValues("remove").Inc()
		d.log.Warn("discovery: unsubscribe failed", "pod", who, "address", addr, "err", err)
		return
	}
	d.log.Info("discovery: unsubscribed and cleared", "pod", who, "address", addr)
}

func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func annotationInt(pod *corev1.Pod, key string, def int, row option.Int) (int, error) {
	v, ok := pod.Annotations[key]
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || row.Check(int64(n)) != nil {
		return 0, fmt.Errorf("annotation %s=%q: want an integer in %s", key, v, row.Range())
	}
	return n, nil
}

func render(t *template.Template, f podFields) (string, error) {
	var b bytes.Buffer
	if err := t.Execute(&b, f); err != nil {
		return "", fmt.Errorf("pod name template: %w", err)
	}
	if b.Len() == 0 {
		return "", errors.New("pod name template gave an empty name")
	}
	return b.String(), nil
}

// slimPod keeps the fields discovery reads, so the informer cache holds a
// few hundred bytes per pod instead of the whole object.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone: passed through as is
	}
	slim := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID,
			ResourceVersion: pod.ResourceVersion, Labels: pod.Labels, Annotations: pod.Annotations,
			DeletionTimestamp: pod.DeletionTimestamp},
		Status: corev1.PodStatus{Phase: pod.Status.Phase, PodIP: pod.Status.PodIP},
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			slim.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return slim, nil
}

// podListWatch lists and watches the pods matching selector.
func podListWatch(pods corev1client.PodInterface, selector string) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return pods.Watch(ctx, o)
		},
	}
}
