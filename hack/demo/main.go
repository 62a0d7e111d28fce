// Command demo shows kvindexd working without GPUs: it starts the daemon on
// the in-memory index, plays a small fleet of fake vLLM engines that publish
// realistic KV-cache events (shared system-prompt prefixes, per-pod LRU
// evictions, a data-parallel pod, one engine restart) and prints, every few
// seconds, how many leading blocks of a few prompts each pod holds.
//
//	make demo            (= go run ./hack/demo)
//	go run ./hack/demo --duration 60s --kvindexd bin/kvindexd
//
// The daemon serves the model with the committed Qwen3 tokenizer, as `make
// run` does, and the fleet's shared system prompts are real text tokenized
// with it: the status page (its address is printed) scores a prompt that
// starts with one of them against the fleet. It stops by itself after
// --duration or on Ctrl-C.
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
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/tokenization"
)

const (
	model     = "Qwen/Qwen3-8B"
	blockSize = 16
	hashSeed  = "0"
)

// systemPrompts are the fleet's shared prefixes: most requests start with
// one of them, so a prompt starting with one (on the status page, or a
// curl to /v1/score) matches the pods that served them.
var systemPrompts = []string{
	"You are a helpful assistant for a travel agency. Answer in the customer's language, keep every answer " +
		"under two hundred words, and always give prices in euros including taxes. When a customer asks about " +
		"a destination, name the best months to visit, the typical weather, how to get there by train or plane, " +
		"and one local dish worth trying. Never invent opening hours or prices: say that you do not know and " +
		"suggest where to check. If the customer wants to book, collect the dates, the number of travellers and " +
		"a budget, then summarise them in a short list before confirming anything. Mention travel insurance " +
		"once, without insisting, and remind travellers outside the Schengen area to check their visa " +
		"requirements well before they leave.",
	"You are a code reviewer for a Go project. For every change you review, first say in one sentence what it " +
		"does, then list the problems you find, most serious first: data races, unchecked errors, leaked " +
		"goroutines, allocations on hot paths, missing tests and unclear names. Quote the line you mean and " +
		"propose the corrected code. Do not comment on formatting, which gofmt decides. End with a verdict: " +
		"approve, approve with nits, or request changes, and the one change that matters most. Keep the review " +
		"short enough to read in two minutes and be kind to the author. When the change touches a public " +
		"API, check that the documentation and the changelog say what changed, and ask for a benchmark " +
		"before and after whenever the author claims that something became faster.",
}

type options struct {
	bin          string
	tokenizerDir string
	duration     time.Duration
	every        time.Duration
	verbose      bool
	// onReady, when set, is called with the daemon's HTTP base URL once the
	// fleet is publishing (tests score against it).
	onReady func(base string)
}

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", 30*time.Second, "how long the demo runs")
	flag.DurationVar(&o.every, "every", 3*time.Second, "how often scores are printed")
	flag.StringVar(&o.bin, "kvindexd", "", "kvindexd binary (default: build it with `go build` into a temp dir)")
	flag.StringVar(&o.tokenizerDir, "tokenizer-dir", "tokenization/testdata/qwen3", "tokenizer of "+model+" (the committed Qwen3 tokenizer; relative to the repository root)")
	flag.BoolVar(&o.verbose, "v", false, "show the daemon's log")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// loadTokenizer reads the model's tokenizer: the daemon is given the same
// directory, so the demo's token ids are the ones it computes for a prompt.
func loadTokenizer(dir string) (string, *tokenization.Tokenizer, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", nil, err
	}
	tj, cj, err := tokenization.ReadTokenizerPath(abs)
	if err != nil {
		return "", nil, fmt.Errorf("tokenizer of %s: %w (run from the repository root, or give --tokenizer-dir)", model, err)
	}
	tok, err := tokenization.Load(tj, cj)
	if err != nil {
		return "", nil, fmt.Errorf("tokenizer %s: %w", abs, err)
	}
	return abs, tok, nil
}

func run(ctx context.Context, o options) error {
	tokDir, tok, err := loadTokenizer(o.tokenizerDir)
	if err != nil {
		return err
	}
	var systems [][]uint32
	for _, p := range systemPrompts {
		ids, err := tok.Encode(p, true)
		if err != nil {
			return err
		}
		// Whole blocks only: a prompt that continues the text may
		// tokenize its last partial block differently.
		systems = append(systems, ids[:len(ids)/blockSize*blockSize])
	}
	bin := o.bin
	if bin == "" {
		dir, err := os.MkdirTemp("", "kvindex-demo")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bin = dir + "/kvindexd"
		fmt.Println("building kvindexd ...")
		b := exec.Command("go", "build", "-o", bin, "./cmd/kvindexd")
		b.Stdout, b.Stderr = os.Stdout, os.Stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("go build ./cmd/kvindexd (run from the repository root): %w", err)
		}
	}
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	zmqAddr := fmt.Sprintf("tcp://127.0.0.1:%d", ports[0])
	httpAddr := fmt.Sprintf("127.0.0.1:%d", ports[1])
	// The daemon gets its own context: it must outlive the publisher so the
	// final scores can be printed, and is stopped with SIGTERM (graceful).
	cmd := exec.Command(bin, "serve", "--index", "memory", "--zmq-bind", zmqAddr, "--http-addr", httpAddr,
		"--grpc-addr", fmt.Sprintf("127.0.0.1:%d", ports[2]), "--hash-algo", "sha256", "--hash-seed", hashSeed,
		"--block-size", fmt.Sprint(blockSize), "--capacity", "100000", "--tokenizer", model+"="+tokDir)
	cmd.Stdout = io.Discard
	cmd.Stderr = io.Discard
	if o.verbose {
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	base := "http://" + httpAddr
	if err := waitReady(ctx, base); err != nil {
		return err
	}
	fmt.Printf("kvindexd is up: ZMQ bind %s, HTTP %s, gRPC 127.0.0.1:%d (model %s, sha256, PYTHONHASHSEED=%s, block size %d)\n",
		zmqAddr, base, ports[2], model, hashSeed, blockSize)
	fmt.Printf("status page: %s/ ; this link scores the first system prompt on it:\n  %s/?%s\n\n", base, base,
		url.Values{"model": {model}, "prompt": {systemPrompts[0]}}.Encode())

	// The demo's duration counts from here, not from the build.
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	hasher, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: hashSeed, BlockSize: blockSize})
	if err != nil {
		return err
	}
	f, err := newFleet(zmqAddr, hasher, systems)
	if err != nil {
		return err
	}
	defer f.close()
	if err := f.waitSubscribed(ctx); err != nil {
		return err
	}

	if o.onReady != nil {
		go o.onReady(base)
	}
	start := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	show := time.NewTicker(o.every)
	defer show.Stop()
	restarted := false
	for {
		select {
		case <-ctx.Done():
			fmt.Println("\nfinal scores:")
			printScores(base, f, time.Since(start))
			return nil
		case <-tick.C:
			if err := f.step(); err != nil {
				return err
			}
			if !restarted && time.Since(start) > 14*time.Second {
				restarted = true
				fmt.Println(">>> engine pod-b restarts: its cache is gone and its sequence numbers go back to 0")
				f.restart("pod-b")
			}
		case <-show.C:
			printScores(base, f, time.Since(start))
		}
	}
}

func waitReady(ctx context.Context, base string) error {
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("daemon did not become ready: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// engine is one fake vLLM instance (one DP rank): an LRU of block hashes.
type engine struct {
	pod      string
	rank     int
	pub      *enginepub.Publisher
	seq      uint64
	capacity int
	lru      []uint64 // oldest first
	held     map[uint64]bool
}

type fleet struct {
	engines []*engine
	hasher  *blockkeys.Hasher
	rng     *rand.Rand
	systems [][]uint32 // shared system prompts
	convs   [][]uint32 // conversations seen so far (grow turn by turn)
	probes  [][]uint32 // the prompts whose scores are printed
	names   []string
}

func newFleet(addr string, h *blockkeys.Hasher, systems [][]uint32) (*fleet, error) {
	f := &fleet{hasher: h, rng: rand.New(rand.NewPCG(1, 2))}
	specs := []struct {
		pod   string
		ranks int
	}{{"pod-a", 1}, {"pod-b", 1}, {"pod-c", 1}, {"pod-d", 2}}
	for _, s := range specs {
		for r := 0; r < s.ranks; r++ {
			pub, err := enginepub.NewPublisher(addr, false)
			if err != nil {
				f.close()
				return nil, err
			}
			f.engines = append(f.engines, &engine{pod: s.pod, rank: r, pub: pub, capacity: 150, held: map[uint64]bool{}})
		}
	}
	f.systems = systems
	// Probes: each system prompt plus a fixed question, and a one-off prompt.
	f.probes = [][]uint32{
		append(append([]uint32{}, f.systems[0]...), f.tokens(8*blockSize)...),
		append(append([]uint32{}, f.systems[1]...), f.tokens(12*blockSize)...),
		append(append([]uint32{}, f.systems[0]...), f.tokens(6*blockSize)...), // never served
	}
	f.names = []string{"system A + question 1", "system B + question 2", "system A + new question"}
	return f, nil
}

func (f *fleet) tokens(n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(f.rng.IntN(151000))
	}
	return t
}

func (f *fleet) waitSubscribed(ctx context.Context) error {
	for _, e := range f.engines {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := e.pub.WaitSubscribed(cctx, topic(e))
		cancel()
		if err != nil {
			return fmt.Errorf("daemon did not subscribe: %w", err)
		}
	}
	return nil
}

func topic(e *engine) string { return "kv@" + e.pod + "@" + model }

func (f *fleet) close() {
	for _, e := range f.engines {
		e.pub.Close()
	}
}

// step serves one request on one engine: new full blocks are stored (with
// their parent), and the engine evicts its least recently used blocks.
func (f *fleet) step() error {
	var prompt []uint32
	switch x := f.rng.IntN(10); {
	case x < 2 && len(f.convs) > 0: // a follow-up turn of an earlier conversation
		i := f.rng.IntN(len(f.convs))
		f.convs[i] = append(f.convs[i], f.tokens(blockSize*(1+f.rng.IntN(4)))...)
		prompt = f.convs[i]
	case x < 3: // a probe question (a random-length prefix of it, past its system prompt), now and then
		i := f.rng.IntN(2)
		p, sys := f.probes[i], len(f.systems[i])/blockSize
		n := len(p) / blockSize
		prompt = p[:blockSize*(sys+f.rng.IntN(n-sys+1))]
	default: // a new request on a shared system prompt
		sys := f.systems[f.rng.IntN(len(f.systems))]
		prompt = append(append([]uint32{}, sys...), f.tokens(blockSize*(2+f.rng.IntN(12))+f.rng.IntN(blockSize))...)
		if len(f.convs) < 64 {
			f.convs = append(f.convs, prompt)
		}
	}
	// Cache-aware-ish routing: prefer the engine holding the longest prefix,
	// with some randomness so several pods warm up.
	keys := f.hasher.Keys(nil, prompt, blockkeys.RequestExtras{})
	e := f.engines[f.rng.IntN(len(f.engines))]
	if f.rng.IntN(2) > 0 {
		best := -1
		for _, i := range f.rng.Perm(len(f.engines)) {
			c := f.engines[i]
			n := 0
			for n < len(keys) && c.held[uint64(keys[n])] {
				n++
			}
			if n > best {
				best, e = n, c
			}
		}
	}
	return e.serve(prompt, keys)
}

func (e *engine) serve(prompt []uint32, keys []blockkeys.Key) error {
	b := &event.Batch{Pod: e.pod, Model: model, DPRank: e.rank, Timestamp: float64(time.Now().UnixNano()) / 1e9}
	first := -1
	for i, k := range keys {
		if e.held[uint64(k)] {
			e.touch(uint64(k))
			continue
		}
		if first < 0 {
			first = i
		}
	}
	if first >= 0 {
		ev := event.Event{Kind: event.BlockStored, BlockSize: blockSize,
			TokenIDs: append([]uint32(nil), prompt[first*blockSize:len(keys)*blockSize]...)}
		if first > 0 {
			ev.ParentHash, ev.HasParent = uint64(keys[first-1]), true
		}
		for _, k := range keys[first:] {
			ev.BlockHashes = append(ev.BlockHashes, uint64(k))
			e.held[uint64(k)] = true
			e.lru = append(e.lru, uint64(k))
		}
		b.Events = append(b.Events, ev)
	}
	if over := len(e.lru) - e.capacity; over > 0 {
		ev := event.Event{Kind: event.BlockRemoved}
		for _, k := range e.lru[:over] {
			delete(e.held, k)
			ev.BlockHashes = append(ev.BlockHashes, k)
		}
		e.lru = append(e.lru[:0], e.lru[over:]...)
		b.Events = append(b.Events, ev)
	}
	if len(b.Events) == 0 {
		return nil
	}
	return e.publish(b)
}

func (e *engine) publish(b *event.Batch) error {
	payload, err := enginepub.EncodeVLLMBatch(b, enginepub.VLLMEncodeOptions{MapForm: true})
	if err != nil {
		return err
	}
	err = e.pub.Publish(topic(e), e.seq, payload)
	e.seq++
	return err
}

func (e *engine) touch(k uint64) {
	for i, x := range e.lru {
		if x == k {
			copy(e.lru[i:], e.lru[i+1:])
			e.lru[len(e.lru)-1] = k
			return
		}
	}
}

// restart empties a pod's cache and restarts its sequence at 0, as a
// restarted vLLM does; the daemon sees seq go backwards and clears the pod.
func (f *fleet) restart(pod string) {
	for _, e := range f.engines {
		if e.pod != pod {
			continue
		}
		e.held = map[uint64]bool{}
		e.lru = nil
		e.seq = 0
	}
}

type scoreResp struct {
	TotalBlocks int `json:"total_blocks"`
	Pods        []struct {
		Pod           string  `json:"pod"`
		MatchedBlocks int     `json:"matched_blocks"`
		Score         float64 `json:"score"`
		DPRanks       []struct {
			DPRank        int `json:"dp_rank"`
			MatchedBlocks int `json:"matched_blocks"`
		} `json:"dp_ranks"`
	} `json:"pods"`
}

func printScores(base string, f *fleet, elapsed time.Duration) {
	fmt.Printf("--- t=%2.0fs ---------------------------------------------\n", elapsed.Seconds())
	for i, p := range f.probes {
		body, _ := json.Marshal(map[string]any{"model": model, "token_ids": p})
		resp, err := http.Post(base+"/v1/score", "application/json", bytes.NewReader(body))
		if err != nil {
			fmt.Println("score:", err)
			return
		}
		var sr scoreResp
		err = json.NewDecoder(resp.Body).Decode(&sr)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			fmt.Println("score: HTTP", resp.Status, err)
			return
		}
		var parts []string
		for _, ps := range sr.Pods {
			s := fmt.Sprintf("%s %d/%d", ps.Pod, ps.MatchedBlocks, sr.TotalBlocks)
			if len(ps.DPRanks) > 1 || (len(ps.DPRanks) == 1 && ps.DPRanks[0].DPRank > 0) {
				s += fmt.Sprintf(" (dp rank %d)", ps.DPRanks[0].DPRank)
			}
			parts = append(parts, s)
		}
		if len(parts) == 0 {
			parts = []string{"no pod holds its first block"}
		}
		fmt.Printf("  %-28s %s\n", f.names[i]+":", strings.Join(parts, ", "))
	}
	resp, err := http.Get(base + "/v1/pods")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	var pods struct {
		Pods []struct {
			Pod              string `json:"pod"`
			DPRank           int    `json:"dp_rank"`
			Blocks           int64  `json:"blocks"`
			EventsApplied    uint64 `json:"events_applied"`
			Restarts         uint64 `json:"restarts"`
			ParityMatches    uint64 `json:"parity_matches"`
			ParityMismatches uint64 `json:"parity_mismatches"`
		} `json:"pods"`
	}
	if json.NewDecoder(resp.Body).Decode(&pods) != nil {
		return
	}
	for _, p := range pods.Pods {
		fmt.Printf("  %s/dp%d: %4d blocks, %4d events, %d restarts, parity %d ok / %d bad\n",
			p.Pod, p.DPRank, p.Blocks, p.EventsApplied, p.Restarts, p.ParityMatches, p.ParityMismatches)
	}
}
