// Package requestcontrol mirrors the producer-side interfaces of llm-d-router's
// pkg/epp/framework/interface/requestcontrol (plugins.go) at
// ebab687927f5331c1b39defcb579a07951bce56c (see package mirror).
package requestcontrol

import (
	"context"

	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/plugin"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/scheduling"
)

// DataProducer runs before scheduling and writes data onto the candidate
// endpoints for scorers, filters and deciders to read.
type DataProducer interface {
	plugin.ProducerPlugin
	Produce(ctx context.Context, request *scheduling.InferenceRequest, pods []scheduling.Endpoint) error
}

// PreRequest runs after scheduling, before the request is sent.
type PreRequest interface {
	plugin.Plugin
	PreRequest(ctx context.Context, request *scheduling.InferenceRequest, schedulingResult *scheduling.SchedulingResult) error
}
