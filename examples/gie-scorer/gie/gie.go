// Package gie mirrors the few types of the Gateway API Inference
// Extension's endpoint-picker scheduling framework
// (sigs.k8s.io/gateway-api-inference-extension, pkg/epp/framework/scheduling
// and pkg/epp/plugins) that a scorer plugin touches. The real module could
// not be fetched from the Go module proxy when this example was written, so
// the example compiles against this mirror; with the real module, replace
// the import and the method set stays the same.
package gie

import "context"

// TypedName is a plugin's type and instance name.
type TypedName struct {
	Type string
	Name string
}

// ScorerCategory tells the framework what a scorer optimises.
type ScorerCategory string

const (
	// Affinity scorers prefer endpoints that already hold state for the
	// request (prefix caches, LoRA adapters).
	Affinity ScorerCategory = "Affinity"
	// Distribution scorers spread load.
	Distribution ScorerCategory = "Distribution"
)

// Metrics are an endpoint's scraped model-server metrics.
type Metrics struct {
	WaitingQueueSize    int
	RunningRequestsSize int
	// KVCacheUsagePercent is a fraction 0..1 (GIE's naming).
	KVCacheUsagePercent float64
}

// NamespacedName is a Kubernetes object name.
type NamespacedName struct {
	Namespace string
	Name      string
}

// EndpointMetadata names an endpoint.
type EndpointMetadata struct {
	NamespacedName NamespacedName
	Address        string
}

// Endpoint is one model-server endpoint a request may go to.
type Endpoint interface {
	GetMetadata() *EndpointMetadata
	GetMetrics() *Metrics
}

// LLMRequest is the request being scheduled.
type LLMRequest struct {
	RequestID   string
	TargetModel string
	Prompt      string
}

// CycleState carries data between plugins within one scheduling cycle.
type CycleState struct{}

// Scorer scores endpoints in [0, 1]; the profile combines scorers by
// weight and a picker takes the best.
type Scorer interface {
	TypedName() TypedName
	Category() ScorerCategory
	Score(ctx context.Context, cs *CycleState, req *LLMRequest, endpoints []Endpoint) map[Endpoint]float64
}
