// Command loadgen measures end-to-end score latency of a running kvindexd
// over gRPC and HTTP (loopback only), after publishing a known fleet state
// through the daemon's ZMQ bind socket so every request walks real entries.
//
//	make run &                     # or any kvindexd on 127.0.0.1
//	go run ./hack/loadgen --pods 64 --tokens 8192 --concurrency 8 --duration 10s
//
// It prints p50/p90/p99/max and throughput per transport. With --publishers
// N it runs the mixed scenario instead (mixed.go): N engines publish stored
// blocks with token ids while the gRPC clients score. Bounded by
// --duration and --requests; refuses non-loopback addresses.
//
// The block hashes it publishes are computed with the daemon's hash
// algorithm, seed and block size, read from GET /v1/status, and it stops
// with an error when the daemon's parity check disagrees (keys.go).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/grpcbuf"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/kvevents/event"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

type options struct {
	grpcAddr, httpAddr, zmq string
	model                   string
	algo, seed              string
	blockSize               int
	pods, tokens, prompts   int
	concurrency             int
	duration                time.Duration
	requests                int64
	mode                    string
	input                   string
	tokenField              string
	publish                 bool
	floor                   time.Duration
	publishers, stepBlocks  int
	engineRate              float64
	set                     map[string]bool // the flags given on the command line
}

func main() {
	o := options{set: map[string]bool{}}
	flag.StringVar(&o.grpcAddr, "grpc-addr", "127.0.0.1:50051", "daemon gRPC address (host:port, or unix:///path)")
	flag.StringVar(&o.httpAddr, "http-addr", "127.0.0.1:8080", "daemon HTTP address")
	flag.StringVar(&o.zmq, "zmq", "tcp://127.0.0.1:5557", "daemon ZMQ bind address to publish the fleet state to")
	flag.BoolVar(&o.publish, "publish", true, "publish the fleet state before measuring")
	flag.DurationVar(&o.floor, "floor", 2*time.Second, "first measure an empty gRPC call (grpc.health.v1 Check) this long: the transport's floor on this machine (0 = skip)")
	flag.StringVar(&o.model, "model", "loadgen/model", "model name")
	flag.StringVar(&o.algo, flagAlgo, "", "hash algorithm (default: the daemon's, from /v1/status; give it only for a model with its own key config)")
	flag.StringVar(&o.seed, flagSeed, "", "hash seed (default: the daemon's, from /v1/status; give it only for a model with its own key config)")
	flag.IntVar(&o.blockSize, flagBlockSize, 0, "block size (default: the daemon's, from /v1/status; give it only for a model with its own key config)")
	flag.IntVar(&o.pods, "pods", 8, "pods in the fleet")
	flag.IntVar(&o.tokens, "tokens", 8192, "tokens per request (8192 = 512 blocks of 16)")
	flag.IntVar(&o.prompts, "prompts", 16, "distinct prompts (each pod holds a random prefix of each)")
	flag.IntVar(&o.concurrency, "concurrency", 8, "concurrent clients per transport")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measuring time per transport")
	flag.Int64Var(&o.requests, "requests", 200000, "at most this many requests per transport")
	flag.StringVar(&o.mode, "mode", "both", "grpc | http | both")
	flag.StringVar(&o.input, "input", "tokens", "tokens (daemon hashes the blocks) | hashes (block_hashes: lookup + transport only)")
	flag.StringVar(&o.tokenField, "token-field", "packed", "how token ids travel over gRPC: packed (little-endian bytes, as the Go client sends them) | ids (varints) | both (one phase each)")
	flag.IntVar(&o.publishers, "publishers", 0, "mixed scenario: engines publishing BlockStored with token ids while the gRPC clients score (0 = off)")
	flag.Float64Var(&o.engineRate, "engine-rate", 12500, "mixed scenario: stored blocks/s per engine")
	flag.IntVar(&o.stepBlocks, "step-blocks", 32, "mixed scenario: blocks stored per engine step (batch)")
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func loopback(addr string) error {
	if strings.HasPrefix(addr, "unix://") {
		return nil // a unix socket is local by nature
	}
	host, _, err := net.SplitHostPort(strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		return err
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s is not a loopback address: loadgen only talks to 127.0.0.1", addr)
	}
	return nil
}

func run(o options) error {
	for _, a := range []string{o.grpcAddr, o.httpAddr, o.zmq} {
		if err := loopback(a); err != nil {
			return err
		}
	}
	daemon, derr := daemonKeys(o.httpAddr)
	keys, err := resolveKeys(o, daemon, derr, os.Stderr)
	if err != nil {
		return err
	}
	h, err := blockkeys.NewHasher(keys)
	if err != nil {
		return err
	}
	o.algo, o.seed, o.blockSize = string(keys.Algo), keys.Seed, keys.BlockSize
	rng := rand.New(rand.NewPCG(7, 11))
	prompts := make([][]uint32, o.prompts)
	for i := range prompts {
		prompts[i] = make([]uint32, o.tokens)
		for j := range prompts[i] {
			prompts[i][j] = uint32(rng.IntN(150000))
		}
	}
	if o.publish {
		if err := publish(o, h, prompts, rng); err != nil {
			return err
		}
		pods := map[string]bool{}
		for p := 0; p < o.pods; p++ {
			pods[podName(p)] = true
		}
		if err := checkParity(o, keys, pods); err != nil {
			return err
		}
	}
	var hashes [][]uint64
	switch o.input {
	case "tokens":
	case "hashes":
		for _, p := range prompts {
			var hs []uint64
			for _, k := range h.Keys(nil, p, blockkeys.RequestExtras{}) {
				hs = append(hs, uint64(k))
			}
			hashes = append(hashes, hs)
		}
	default:
		return fmt.Errorf("--input %q: want tokens or hashes", o.input)
	}
	fmt.Printf("loadgen: %d pods, %d prompts of %d tokens (%d blocks) as %s, concurrency %d, %s per transport; keys %s\n",
		o.pods, o.prompts, o.tokens, o.tokens/o.blockSize, o.input, o.concurrency, o.duration, keys)
	if o.publishers > 0 {
		if o.engineRate <= 0 || o.stepBlocks <= 0 {
			return fmt.Errorf("--engine-rate and --step-blocks must be positive")
		}
		return runMixed(o, h, prompts)
	}
	if o.mode == "grpc" || o.mode == "both" {
		if err := measureFloor(o); err != nil {
			return err
		}
		fields := []string{o.tokenField}
		switch {
		case o.input != "tokens":
			fields = []string{"hashes"}
		case o.tokenField == "both":
			fields = []string{"ids", "packed"}
		case o.tokenField != "ids" && o.tokenField != "packed":
			return fmt.Errorf("--token-field %q: want packed, ids or both", o.tokenField)
		}
		for _, f := range fields {
			if err := measureGRPC(o, prompts, hashes, f); err != nil {
				return err
			}
		}
	}
	if o.mode == "http" || o.mode == "both" {
		if err := measureHTTP(o, prompts, hashes); err != nil {
			return err
		}
	}
	return nil
}

// publish makes every pod hold a random-length prefix of every prompt, then
// waits until the daemon has applied it: the very last batch (last pod, last
// prompt) stores the whole prompt, and a pod's batches apply in order, so
// once that full match is visible the last pod is complete (the others were
// published earlier, on workers of their own).
func publish(o options, h *blockkeys.Hasher, prompts [][]uint32, rng *rand.Rand) error {
	pub, err := enginepub.NewPublisher(o.zmq, false)
	if err != nil {
		return err
	}
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topic := func(p int) string { return "kv@" + podName(p) + "@" + o.model }
	if err := pub.WaitSubscribed(ctx, topic(0)); err != nil {
		return fmt.Errorf("daemon is not subscribed on %s: %w", o.zmq, err)
	}
	want, lastPrompt := 0, prompts[len(prompts)-1]
	for p := 0; p < o.pods; p++ {
		for i, pr := range prompts {
			keys := h.Keys(nil, pr, blockkeys.RequestExtras{})
			n := 1 + rng.IntN(len(keys))
			if i == len(prompts)-1 && p == o.pods-1 {
				n = len(keys) // the marker: see above
				want = n
			}
			ev := event.Event{Kind: event.BlockStored, BlockSize: o.blockSize, TokenIDs: pr[:n*o.blockSize]}
			for _, k := range keys[:n] {
				ev.BlockHashes = append(ev.BlockHashes, uint64(k))
			}
			b := &event.Batch{Pod: podName(p), Model: o.model, Events: []event.Event{ev}}
			payload, err := enginepub.EncodeVLLMBatch(b, enginepub.VLLMEncodeOptions{})
			if err != nil {
				return err
			}
			if err := pub.Publish(topic(p), uint64(i), payload); err != nil {
				return err
			}
		}
	}
	// Wait for the marker.
	return withGRPC(o, func(conn *grpc.ClientConn) error {
		c := kvindexv1.NewIndexerClient(conn)
		last := podName(o.pods - 1)
		for {
			resp, err := c.Score(ctx, &kvindexv1.ScoreRequest{Model: o.model, Pods: []string{last},
				Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: lastPrompt}}})
			if err == nil && len(resp.Pods) == 1 && int(resp.Pods[0].MatchedBlocks) == want {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("published state did not become visible: last answer %v, err %v", resp, err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
}

// podName is the name of the p-th published pod.
func podName(p int) string { return fmt.Sprintf("loadgen-pod-%02d", p) }

type recorder struct {
	mu   sync.Mutex
	lat  []time.Duration
	errs atomic.Int64
	n    atomic.Int64
}

func drive(o options, name string, call func(worker, i int) error) error {
	var rec recorder
	deadline := time.Now().Add(o.duration)
	var wg sync.WaitGroup
	start := time.Now()
	var firstErr atomic.Pointer[error]
	for w := 0; w < o.concurrency; w++ {
		wg.Go(func() {
			local := make([]time.Duration, 0, 4096)
			for i := 0; time.Now().Before(deadline); i++ {
				if rec.n.Add(1) > o.requests {
					break
				}
				t0 := time.Now()
				err := call(w, i)
				local = append(local, time.Since(t0))
				if err != nil {
					rec.errs.Add(1)
					firstErr.CompareAndSwap(nil, &err)
				}
			}
			rec.mu.Lock()
			rec.lat = append(rec.lat, local...)
			rec.mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if p := firstErr.Load(); p != nil {
		fmt.Printf("%s: %d errors, first: %v\n", name, rec.errs.Load(), *p)
	}
	report(name, rec.lat, elapsed)
	return nil
}

func report(name string, lat []time.Duration, elapsed time.Duration) {
	if len(lat) == 0 {
		fmt.Printf("%-5s no requests\n", name)
		return
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	fmt.Printf("%-11s %8d req in %5.1fs  %8.0f req/s  p50 %8s  p90 %8s  p99 %8s  max %8s\n", name, len(lat),
		elapsed.Seconds(), float64(len(lat))/elapsed.Seconds(), q(0.50).Round(time.Microsecond),
		q(0.90).Round(time.Microsecond), q(0.99).Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond))
}

// withGRPC runs f on a connection to the daemon's gRPC address, closed
// when f returns: every gRPC phase of the run connects this way, in
// plaintext (loadgen has no TLS option).
func withGRPC(o options, f func(conn *grpc.ClientConn) error) error {
	// The Go client's options (client.New): its buffer pool and codec.
	conn, err := grpc.NewClient(o.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		experimental.WithBufferPool(grpcbuf.Pool), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(grpcbuf.Codec)))
	if err != nil {
		return err
	}
	defer conn.Close()
	return f(conn)
}

// measureGRPC scores the prompts with token ids sent as field (ids or
// packed), or with their block hashes.
func measureGRPC(o options, prompts [][]uint32, hashes [][]uint64, field string) error {
	reqs := make([]*kvindexv1.ScoreRequest, len(prompts))
	for i, p := range prompts {
		ids := &kvindexv1.TokenIDs{Ids: p}
		if field == "packed" {
			ids = &kvindexv1.TokenIDs{Packed: kvindexv1.PackTokenIDs(p)}
		}
		reqs[i] = &kvindexv1.ScoreRequest{Model: o.model, Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: ids}}
		if hashes != nil {
			reqs[i].Input = &kvindexv1.ScoreRequest_BlockHashes{BlockHashes: &kvindexv1.BlockHashes{Hashes: hashes[i]}}
		}
	}
	return withGRPC(o, func(conn *grpc.ClientConn) error {
		c := kvindexv1.NewIndexerClient(conn)
		return drive(o, "grpc-"+field, func(w, i int) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := c.Score(ctx, reqs[(w+i)%len(reqs)])
			if err == nil && len(resp.Pods) == 0 {
				err = fmt.Errorf("empty score")
			}
			return err
		})
	})
}

// measureFloor times the cheapest call the daemon answers, a health Check,
// with the same concurrency: what any gRPC request costs on this machine
// (client, loopback, scheduler) before the daemon does any work.
func measureFloor(o options) error {
	if o.floor <= 0 {
		return nil
	}
	fo := o
	fo.duration = o.floor
	return withGRPC(o, func(conn *grpc.ClientConn) error {
		c := healthpb.NewHealthClient(conn)
		return drive(fo, "floor", func(int, int) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
			return err
		})
	})
}

func measureHTTP(o options, prompts [][]uint32, hashes [][]uint64) error {
	bodies := make([][]byte, len(prompts))
	for i, p := range prompts {
		body := map[string]any{"model": o.model, "token_ids": p}
		if hashes != nil {
			body = map[string]any{"model": o.model, "block_hashes": hashes[i]}
		}
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		bodies[i] = b
	}
	tr := &http.Transport{MaxIdleConnsPerHost: o.concurrency, MaxConnsPerHost: o.concurrency}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	url := "http://" + o.httpAddr + "/v1/score"
	return drive(o, "http", func(w, i int) error {
		resp, err := client.Post(url, "application/json", bytes.NewReader(bodies[(w+i)%len(bodies)]))
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("HTTP %s", resp.Status)
		}
		return nil
	})
}
