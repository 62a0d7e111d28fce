// Package scheduling mirrors llm-d-router's
// pkg/epp/framework/interface/scheduling (types.go) at
// ebab687927f5331c1b39defcb579a07951bce56c (see package mirror).
package scheduling

import (
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/datalayer"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/plugin"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/requesthandling"
)

// TokenizedRequest is requesthandling's, as upstream aliases it.
type TokenizedRequest = requesthandling.TokenizedRequest

// InferenceRequest is the request being scheduled (upstream also carries
// headers, objectives, fairness id and per-request attributes).
type InferenceRequest struct {
	RequestID        string
	TargetModel      string
	Body             *requesthandling.InferenceRequestBody
	SchedulingResult *SchedulingResult
}

// Endpoint is one candidate model server with its data.
type Endpoint interface {
	GetMetadata() *datalayer.EndpointMetadata
	GetMetrics() *datalayer.Metrics
	String() string
	Get(plugin.DataKey) (datalayer.Cloneable, bool)
	Put(plugin.DataKey, datalayer.Cloneable)
	Keys() []plugin.DataKey
	Clone() datalayer.AttributeMap
}

type endpoint struct {
	*datalayer.EndpointMetadata
	*datalayer.Metrics
	datalayer.AttributeMap
}

// NewEndpoint builds an Endpoint (attr nil = empty).
func NewEndpoint(meta *datalayer.EndpointMetadata, metrics *datalayer.Metrics, attr datalayer.AttributeMap) Endpoint {
	if attr == nil {
		attr = datalayer.NewAttributes()
	}
	return &endpoint{EndpointMetadata: meta, Metrics: metrics, AttributeMap: attr}
}

func (ep *endpoint) GetMetadata() *datalayer.EndpointMetadata { return ep.EndpointMetadata }
func (ep *endpoint) GetMetrics() *datalayer.Metrics           { return ep.Metrics }
func (ep *endpoint) String() string                           { return ep.Address + ":" + ep.Port }
func (ep *endpoint) Clone() datalayer.AttributeMap            { return ep.AttributeMap.Clone() }

// ProfileRunResult is one scheduling profile's outcome.
type ProfileRunResult struct {
	TargetEndpoints []Endpoint
}

// SchedulingResult is the scheduling cycle's outcome, by profile name.
type SchedulingResult struct {
	ProfileResults     map[string]*ProfileRunResult
	PrimaryProfileName string
}
