package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/examples/gie-scorer/gie"
)

// endpoint is a static gie.Endpoint for the demo.
type endpoint struct {
	md gie.EndpointMetadata
	m  gie.Metrics
}

func (e *endpoint) GetMetadata() *gie.EndpointMetadata { return &e.md }
func (e *endpoint) GetMetrics() *gie.Metrics           { return &e.m }

// main scores one prompt over pods named on the command line
// (pod or pod=running/waiting/kv_usage ...) against a running daemon:
//
//	go run . -addr 127.0.0.1:50051 -model m -prompt "hello" a=3/0/0.4 b=1/0/0.2
func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "kvindexd gRPC address")
	model := flag.String("model", "", "model name")
	prompt := flag.String("prompt", "", "prompt to route")
	policy := flag.String("policy", "", "daemon policy (\"\" = its default)")
	flag.Parse()
	c, err := client.New(client.Config{Addr: *addr, Timeout: 200 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer c.Close()
	var eps []gie.Endpoint
	for _, a := range flag.Args() {
		e, err := parseEndpoint(a)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		eps = append(eps, e)
	}
	s := NewScorer("kvindex", c, *policy, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	for ep, v := range s.Score(context.Background(), &gie.CycleState{}, &gie.LLMRequest{TargetModel: *model, Prompt: *prompt}, eps) {
		fmt.Printf("%s\t%g\n", ep.GetMetadata().NamespacedName.Name, v)
	}
}

// parseEndpoint reads "pod" or "pod=running/waiting/kv_usage".
func parseEndpoint(a string) (*endpoint, error) {
	e := &endpoint{}
	name, load, ok := strings.Cut(a, "=")
	e.md.NamespacedName.Name = name
	if !ok {
		return e, nil
	}
	if _, err := fmt.Sscanf(strings.ReplaceAll(load, "/", " "), "%d %d %g", &e.m.RunningRequestsSize, &e.m.WaitingQueueSize, &e.m.KVCacheUsagePercent); err != nil {
		return nil, fmt.Errorf("endpoint %q: want pod=running/waiting/kv_usage: %v", a, err)
	}
	return e, nil
}
