package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/examples/gie-scorer/gie"
	"github.com/kvindex/kvindex/indexer"
)

// endpoint is a static gie.Endpoint for the demo.
type endpoint struct {
	md gie.EndpointMetadata
	m  gie.Metrics
}

func (e *endpoint) GetMetadata() *gie.EndpointMetadata { return &e.md }
func (e *endpoint) GetMetrics() *gie.Metrics           { return &e.m }

// defaultModel is the model `make run` serves, with the committed Qwen3
// tokenizer: the daemon tokenizes the prompt with the model's tokenizer, so
// a model it has no tokenizer for cannot be scored.
const defaultModel = "Qwen/Qwen3-8B"

// main scores one prompt over pods named on the command line
// (pod or pod=running/waiting/kv_usage ...) against a running daemon
// (`make run` in the repository root):
//
//	go run . -prompt "hello" a=3/0/0.4 b=1/0/0.2
//	go run . -addr 127.0.0.1:50051 -model Qwen/Qwen3-8B -prompt "hello" a b
//	go run . -addr unix:///run/kvindex/grpc.sock -prompt "hello" a b
//
// or with the index in this process, subscribed to the engines directly:
//
//	go run . -embedded -engine tcp://10.0.0.7:5557,pod=a -tokenizer DIR -prompt "hello" a b
func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command: it prints one "pod<TAB>score" line per endpoint and
// returns the exit status (1 when the daemon refuses the request, with why).
func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("gie-scorer", flag.ContinueOnError)
	fl.SetOutput(stderr)
	addr := fl.String("addr", "127.0.0.1:50051", "kvindexd gRPC address: host:port, or unix:///path for a daemon on a unix socket")
	model := fl.String("model", defaultModel, "model name; the daemon needs its tokenizer (`make run` has "+
		defaultModel+"'s; other models: kvindexd --tokenizer NAME=DIR)")
	prompt := fl.String("prompt", "", "prompt to route")
	policy := fl.String("policy", "", "daemon policy (\"\" = its default)")
	embedded := fl.Bool("embedded", false, "run the index in this process (package indexer) instead of asking a daemon: "+
		"it subscribes to -engine and -bind itself")
	var em embeddedConfig
	fl.Func("engine", "with -embedded: an engine's KV-event endpoint, tcp://host:port[,pod=NAME] (repeatable)", func(v string) error {
		em.engines = append(em.engines, v)
		return nil
	})
	fl.StringVar(&em.bind, "bind", "", "with -embedded: bind this ZMQ address for engines that connect (tcp://*:5557)")
	fl.StringVar(&em.tokenizer, "tokenizer", "", "with -embedded: the model's tokenizer directory (tokenizer.json)")
	fl.StringVar(&em.hashSeed, "hash-seed", "0", "with -embedded: the engines' PYTHONHASHSEED")
	fl.IntVar(&em.blockSize, "block-size", 16, "with -embedded: the engines' block size")
	wait := fl.Duration("wait", time.Second, "with -embedded: how long to collect events before scoring")
	fl.Usage = func() {
		fmt.Fprintln(fl.Output(), "usage: gie-scorer [flags] pod[=running/waiting/kv_usage] ...")
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if fl.NArg() == 0 {
		fmt.Fprintln(stderr, "gie-scorer: name at least one endpoint (pod or pod=running/waiting/kv_usage)")
		return 2
	}
	var eps []gie.Endpoint
	for _, a := range fl.Args() {
		e, err := parseEndpoint(a)
		if err != nil {
			fmt.Fprintln(stderr, "gie-scorer:", err)
			return 2
		}
		eps = append(eps, e)
	}
	var c Picker
	if *embedded {
		em.model = *model
		x, stop, err := startEmbedded(context.Background(), em)
		if err != nil {
			fmt.Fprintln(stderr, "gie-scorer:", err)
			return 2
		}
		defer stop()
		settle(context.Background(), *wait)
		c = InProcess{X: x}
	} else {
		cl, err := client.New(client.Config{Addr: *addr, Timeout: 2 * time.Second})
		if err != nil {
			fmt.Fprintln(stderr, "gie-scorer:", err)
			return 2
		}
		defer cl.Close()
		c = cl
	}
	// Debug: the CLI shows when the client voted least loaded without the daemon.
	s := NewScorer("kvindex", c, *policy, slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
	scores, err := s.score(context.Background(), &gie.LLMRequest{TargetModel: *model, Prompt: *prompt}, eps)
	for _, ep := range eps {
		fmt.Fprintf(stdout, "%s\t%g\n", ep.GetMetadata().NamespacedName.Name, scores[ep])
	}
	if err != nil {
		fmt.Fprintln(stderr, "gie-scorer: the daemon did not pick (every score is 0):", err)
		var ie *indexer.Error
		precondition := status.Code(err) == codes.FailedPrecondition || errors.As(err, &ie) && ie.Code == indexer.FailedPrecondition
		if precondition && strings.Contains(err.Error(), "tokenizer") {
			fmt.Fprintf(stderr, "gie-scorer: the daemon has no tokenizer for model %q: use -model %s (what `make run` serves), "+
				"or start kvindexd with --tokenizer %s=DIR\n", *model, defaultModel, *model)
		}
		return 1
	}
	return 0
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
