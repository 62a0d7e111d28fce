package llmdproducer

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/datalayer"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/plugin"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/prefix"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/requesthandling"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/scheduling"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

const (
	model     = "org/model"
	blockSize = 16 // kvindexd's default --block-size
)

// prompt is n blocks of token ids distinct per base.
func prompt(base, n int) []uint32 {
	t := make([]uint32, n*blockSize)
	for i := range t {
		t[i] = uint32(base*100_000 + i + 1)
	}
	return t
}

// engineHashes are the hashes a vLLM engine with the daemon's default key
// settings publishes for tokens.
func engineHashes(t *testing.T, tokens []uint32) []uint64 {
	t.Helper()
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: blockkeys.DefaultSeed, BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, k := range h.Keys(nil, tokens, blockkeys.RequestExtras{}) {
		out = append(out, uint64(k))
	}
	return out
}

func publish(t *testing.T, p *enginepub.Publisher, pod string, seq uint64, evs ...event.Event) {
	t.Helper()
	payload, err := enginepub.EncodeVLLMBatch(&event.Batch{Events: evs}, enginepub.VLLMEncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish("kv@"+pod+"@"+model, seq, payload); err != nil {
		t.Fatal(err)
	}
}

// storedRun is a BlockStored of blocks [from, to) of tokens on tier.
func storedRun(tokens []uint32, hs []uint64, from, to int, tier event.Tier) event.Event {
	e := event.Event{Kind: event.BlockStored, BlockHashes: hs[from:to], TokenIDs: tokens[from*blockSize : to*blockSize],
		BlockSize: blockSize, Medium: tier}
	if from > 0 {
		e.ParentHash, e.HasParent = hs[from-1], true
	}
	return e
}

func endpoint(addr string) scheduling.Endpoint {
	host, port, _ := strings.Cut(addr, ":")
	return scheduling.NewEndpoint(&datalayer.EndpointMetadata{Address: host, Port: port, Name: "pod-" + host},
		&datalayer.Metrics{}, nil)
}

func request(id string, tokens []uint32) *scheduling.InferenceRequest {
	return &scheduling.InferenceRequest{RequestID: id, TargetModel: model,
		Body: &requesthandling.InferenceRequestBody{TokenizedRequest: &requesthandling.TokenizedRequest{
			Prompts: []requesthandling.PromptTokens{{TokenIDs: tokens}}}}}
}

type handle struct{ ctx context.Context }

func (h handle) Context() context.Context { return h.ctx }

// newProducer builds the plugin through its factory, as the framework does
// from an EndpointPickerConfig's parameters.
func newProducer(t *testing.T, name, params string) *Producer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pl, err := PluginFactory(name, plugin.StrictDecoder(json.RawMessage(params)), handle{ctx})
	if err != nil {
		t.Fatal(err)
	}
	return pl.(*Producer)
}

func infoOf(t *testing.T, ep scheduling.Endpoint, producer string) *prefix.PrefixCacheMatchInfo {
	t.Helper()
	v, ok := ep.Get(prefix.PrefixCacheMatchInfoDataKey.WithNonEmptyProducerName(producer))
	if !ok {
		t.Fatalf("%s: no PrefixCacheMatchInfo from %q", ep, producer)
	}
	return v.(*prefix.PrefixCacheMatchInfo)
}

// TestProducerAgainstDaemon runs the producer against the kvindexd binary
// fed real vLLM KV events: every endpoint's PrefixCacheMatchInfo (weighted
// match, cached blocks, tier breakdown, totals) is what the daemon's Score
// reports for it, under the key prefix-cache-scorer reads with
// prefixMatchInfoProducerName; PreRequest makes the daemon hold the request
// for the chosen decode and prefill endpoints (speculative blocks in its
// next Pick).
func TestProducerAgainstDaemon(t *testing.T) {
	d := harness.Start(t)
	pub := d.Publisher()
	toks := prompt(1, 10)
	hs := engineHashes(t, toks)
	// a: 8 blocks on GPU; b: 6 on CPU; c: 4 on GPU then 2 only on CPU;
	// e: 6 on GPU, all of them offloaded to CPU too, and a CPU-only tail
	// of 2 more.
	publish(t, pub, "10.0.0.1:8000", 0, storedRun(toks, hs, 0, 8, event.TierGPU))
	publish(t, pub, "10.0.0.2:8000", 0, storedRun(toks, hs, 0, 6, event.TierCPU))
	publish(t, pub, "10.0.0.3:8000", 0, storedRun(toks, hs, 0, 4, event.TierGPU), storedRun(toks, hs, 4, 6, event.TierCPU))
	publish(t, pub, "10.0.0.5:8000", 0, storedRun(toks, hs, 0, 6, event.TierGPU), storedRun(toks, hs, 0, 8, event.TierCPU))
	wait.Until(t, "the daemon applies the events", func() string {
		got := d.ScoreTokens(model, toks)
		want := map[string]int{"10.0.0.1:8000": 8, "10.0.0.2:8000": 6, "10.0.0.3:8000": 6, "10.0.0.5:8000": 8}
		if !maps.Equal(got, want) {
			return fmt.Sprintf("scores %v, want %v", got, want)
		}
		return ""
	})

	const name = "precise-prefix-cache-producer" // the instance name the scorer already references
	// a TTL no slow run outlives; TestSpecRecord checks expiry
	p := newProducer(t, name, fmt.Sprintf(`{"kvindexAddr": %q, "speculativeIndexing": true, "speculativeTTL": "10m", "timeout": "10s"}`, d.GRPC))
	if got := p.TypedName(); got != (plugin.TypedName{Type: PluginType, Name: name}) {
		t.Errorf("TypedName %+v", got)
	}
	eps := []scheduling.Endpoint{endpoint("10.0.0.1:8000"), endpoint("10.0.0.2:8000"), endpoint("10.0.0.3:8000"), endpoint("10.0.0.4:8000"),
		endpoint("10.0.0.5:8000")}
	if err := p.Produce(context.Background(), request("r1", toks), eps); err != nil {
		t.Fatal(err)
	}

	// The daemon's own answer, read independently over gRPC.
	conn, err := grpc.NewClient(d.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	gc := kvindexv1.NewIndexerClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), wait.Limit)
	defer cancel()
	sr, err := gc.Score(ctx, &kvindexv1.ScoreRequest{Model: model, Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: toks}}})
	if err != nil {
		t.Fatal(err)
	}
	daemon := map[string]*kvindexv1.PodScore{}
	for _, ps := range sr.GetPods() {
		daemon[ps.GetPod()] = ps
	}
	// Expected numbers, written out as llm-d-router's producer computes
	// them (pkg/epp/framework/plugins/requestcontrol/dataproducer/
	// preciseprefixcache at ebab687927f5): tiers from utils.go
	// matchedBlockCountByTier (per tier, blocks from block 0 until the
	// first one the endpoint lacks on that tier; a block on two tiers in
	// both), cached blocks from matchedBlockCount, the match from
	// kvblock_scorer.go LongestPrefixScorer (each block at its best tier's
	// weight, gpu 1 and cpu 0.8 in kvcache/backend.go and our defaults)
	// truncated by producer.go produceFromBlockKeys. c's CPU blocks follow
	// a GPU-only prefix, so cpu counts 0; e's CPU copies start at block 0.
	type want struct {
		tiers         map[string]int
		cached, match int
	}
	wants := map[string]want{
		"10.0.0.1:8000": {map[string]int{"gpu": 8}, 8, 8},
		"10.0.0.2:8000": {map[string]int{"cpu": 6}, 6, 4},           // 6 x 0.8
		"10.0.0.3:8000": {map[string]int{"gpu": 4}, 6, 5},           // 4 + 2 x 0.8
		"10.0.0.4:8000": {map[string]int{}, 0, 0},                   // holds nothing
		"10.0.0.5:8000": {map[string]int{"gpu": 6, "cpu": 8}, 8, 7}, // 6 + 2 x 0.8
	}
	for _, ep := range eps {
		id := ep.String()
		info := infoOf(t, ep, name)
		ps := daemon[id] // nil for the endpoint holding nothing: zero values
		if info.TotalBlocks() != int(sr.GetTotalBlocks()) || info.TotalBlocks() != 10 || info.BlockSizeTokens() != blockSize {
			t.Errorf("%s: total %d blocks of %d, daemon %d", id, info.TotalBlocks(), info.BlockSizeTokens(), sr.GetTotalBlocks())
		}
		w := wants[id]
		if info.MatchBlocks() != int(ps.GetScore()) || info.CachedBlockCount() != int(ps.GetMatchedBlocks()) ||
			info.MatchBlocks() != w.match || info.CachedBlockCount() != w.cached {
			t.Errorf("%s: match %d cached %d, daemon score %g matched %d, want %d %d", id, info.MatchBlocks(), info.CachedBlockCount(),
				ps.GetScore(), ps.GetMatchedBlocks(), w.match, w.cached)
		}
		daemonTiers := map[string]int{}
		addTiers(daemonTiers, ps.GetTierRuns())
		if got := info.CachedBlocksByTier(); got == nil || !maps.Equal(got, w.tiers) || !maps.Equal(got, daemonTiers) {
			t.Errorf("%s: tiers %v, daemon tier_runs %v, want %v", id, got, daemonTiers, w.tiers)
		}
		if info.MM() != nil {
			t.Errorf("%s: MM set for a text-only request", id)
		}
	}
	// The weighted match ranks GPU above CPU: a (8 GPU) > c > b (6 CPU).
	if a, b, c := infoOf(t, eps[0], name).MatchBlocks(), infoOf(t, eps[1], name).MatchBlocks(), infoOf(t, eps[2], name).MatchBlocks(); !(a > c && c > b && b > 0) {
		t.Errorf("weighted matches a=%d b=%d c=%d, want a > c > b > 0", a, b, c)
	}

	// Scheduling chose 10.0.0.4 (holds nothing) to decode and 10.0.0.3 to
	// prefill: the producer records, and the daemon assumes, that both hold
	// the whole request.
	if st := p.Stats(); st.Pending != 1 {
		t.Fatalf("pending %d, want 1", st.Pending)
	}
	res := &scheduling.SchedulingResult{PrimaryProfileName: "decode", ProfileResults: map[string]*scheduling.ProfileRunResult{
		"decode":  {TargetEndpoints: []scheduling.Endpoint{eps[3]}},
		"prefill": {TargetEndpoints: []scheduling.Endpoint{eps[2]}},
	}}
	if err := p.PreRequest(context.Background(), request("r1", toks), res); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Holds != 2 || st.HoldFailures != 0 || st.Pending != 0 {
		t.Fatalf("after PreRequest: %+v", st)
	}
	yes := true // 10.0.0.4 never published: tell the daemon it does, as PreRequest did
	pr, err := gc.Pick(ctx, &kvindexv1.PickRequest{Model: model, Input: &kvindexv1.PickRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: toks}},
		Candidates: []*kvindexv1.Candidate{{Pod: "10.0.0.4:8000", Events: &yes}, {Pod: "10.0.0.3:8000"}, {Pod: "10.0.0.1:8000"}}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range pr.GetCandidates() {
		got = append(got, fmt.Sprintf("%s=%d/%d", c.GetPod(), c.GetMatchedBlocks(), c.GetSpeculativeBlocks()))
	}
	if want := "10.0.0.4:8000=10/10 10.0.0.3:8000=10/4 10.0.0.1:8000=8/0"; strings.Join(got, " ") != want {
		t.Errorf("daemon's pick after PreRequest: %s, want matched/speculative %s", strings.Join(got, " "), want)
	}
	// PreRequest of a request it did not produce holds nothing.
	if err := p.PreRequest(context.Background(), request("r2", toks), res); err != nil || p.Stats().Holds != 2 {
		t.Errorf("unknown request: err %v, holds %d", err, p.Stats().Holds)
	}

	// Speculative entries, as upstream's Produce reads the entries its
	// PreRequest added (prerequest.go PreRequest: the primary and the
	// "prefill" profile's endpoint, every block of the request): a request
	// of the first 3 blocks goes to b (6 CPU blocks) too.
	short := toks[:3*blockSize]
	if err := p.Produce(context.Background(), request("r3", short), eps); err != nil {
		t.Fatal(err)
	}
	res3 := &scheduling.SchedulingResult{PrimaryProfileName: "default", ProfileResults: map[string]*scheduling.ProfileRunResult{
		"default": {TargetEndpoints: []scheduling.Endpoint{eps[1]}}}}
	if err := p.PreRequest(context.Background(), request("r3", short), res3); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.SpeculativeEntries != 10+10+3 || st.DroppedSpeculative != 0 {
		t.Fatalf("speculative record: %+v", st)
	}
	if err := p.Produce(context.Background(), request("r4", toks), eps); err != nil {
		t.Fatal(err)
	}
	// matchedBlockCountByTier counts speculative entries under
	// "speculative"; matchedBlockCount counts a block held on any tier;
	// LongestPrefixScorer weighs a speculative entry 1 (it has no device
	// tier: fillMaxWeights' default) and takes each block's best weight.
	wants = map[string]want{
		"10.0.0.1:8000": {map[string]int{"gpu": 8}, 8, 8},
		"10.0.0.2:8000": {map[string]int{"cpu": 6, "speculative": 3}, 6, 5},    // 3 x 1 + 3 x 0.8
		"10.0.0.3:8000": {map[string]int{"gpu": 4, "speculative": 10}, 10, 10}, // every block at 1
		"10.0.0.4:8000": {map[string]int{"speculative": 10}, 10, 10},
		"10.0.0.5:8000": {map[string]int{"gpu": 6, "cpu": 8}, 8, 7},
	}
	for _, ep := range eps {
		id, info := ep.String(), infoOf(t, ep, name)
		w := wants[id]
		if !maps.Equal(info.CachedBlocksByTier(), w.tiers) || info.CachedBlockCount() != w.cached || info.MatchBlocks() != w.match {
			t.Errorf("%s with speculative entries: tiers %v cached %d match %d, want %v %d %d", id, info.CachedBlocksByTier(),
				info.CachedBlockCount(), info.MatchBlocks(), w.tiers, w.cached, w.match)
		}
	}
}

// A daemon indexing other blocks than blockSize, an unreachable daemon and
// bad parameters are errors, never wrong numbers.
func TestProducerErrors(t *testing.T) {
	d := harness.Start(t)
	pub := d.Publisher()
	toks := prompt(2, 4)
	publish(t, pub, "10.0.0.1:8000", 0, storedRun(toks, engineHashes(t, toks), 0, 4, event.TierGPU))
	wait.Until(t, "the daemon applies the events", func() string {
		if got := d.ScoreTokens(model, toks)["10.0.0.1:8000"]; got != 4 {
			return fmt.Sprintf("matched %d, want 4", got)
		}
		return ""
	})
	eps := []scheduling.Endpoint{endpoint("10.0.0.1:8000")}

	p := newProducer(t, "x", fmt.Sprintf(`{"kvindexAddr": %q, "blockSize": 8, "timeout": "10s"}`, d.GRPC))
	if err := p.Produce(context.Background(), request("r", toks), eps); err == nil || !strings.Contains(err.Error(), "blocks of 16 tokens, blockSize is 8") {
		t.Errorf("block size mismatch: %v", err)
	}
	down := newProducer(t, "y", fmt.Sprintf(`{"kvindexAddr": "127.0.0.1:%d", "timeout": "200ms"}`, harness.FreePort(t)))
	if err := down.Produce(context.Background(), request("r", toks), eps); err == nil {
		t.Error("Produce against no daemon: no error")
	}
	// No tokens: a no-op, as upstream (nothing written, no call made).
	if err := down.Produce(context.Background(), &scheduling.InferenceRequest{RequestID: "r"}, eps); err != nil {
		t.Errorf("no tokens: %v", err)
	}
	if _, ok := eps[0].Get(prefix.PrefixCacheMatchInfoDataKey.WithNonEmptyProducerName("y")); ok {
		t.Error("match info written for a request without tokens")
	}
	for _, params := range []string{`{"kvindexAddr": "x", "bogus": 1}`, `{"podIdentifier": "ip"}`, `{"timeout": "-1s"}`,
		`{"blockSize": -1}`, `{"maxPending": -1}`, `{"speculativeTTL": "soon"}`, `{"maxSpeculativeEntries": -1}`} {
		if _, err := PluginFactory("z", plugin.StrictDecoder(json.RawMessage(params)), handle{context.Background()}); err == nil {
			t.Errorf("parameters %s accepted", params)
		}
	}

	// The pending state between Produce and PreRequest is capped.
	capped := newProducer(t, "c", fmt.Sprintf(`{"kvindexAddr": %q, "speculativeIndexing": true, "maxPending": 1, "podIdentifier": "name", "timeout": "10s"}`, d.GRPC))
	for _, id := range []string{"r1", "r2"} {
		if err := capped.Produce(context.Background(), request(id, toks), eps); err != nil {
			t.Fatal(err)
		}
	}
	if st := capped.Stats(); st.Pending != 1 || st.DroppedPending != 1 {
		t.Errorf("at the cap: %+v", st)
	}
	// podIdentifier name: the endpoint is pod-10.0.0.1, which holds nothing.
	if info := infoOf(t, eps[0], "c"); info.CachedBlockCount() != 0 || info.TotalBlocks() != 4 {
		t.Errorf("by name: cached %d of %d", info.CachedBlockCount(), info.TotalBlocks())
	}
	// Multimodal: only the prefix before the first media item is scored.
	mm := request("m", toks)
	mm.Body.TokenizedRequest.Prompts[0].MultiModalFeatures = []requesthandling.MultiModalFeature{{Modality: "image", Hash: "h", Offset: 2 * blockSize, Length: 8}}
	if err := p.Produce(context.Background(), mm, eps); err == nil {
		t.Fatal("blockSize 8 producer accepted")
	}
	ok := newProducer(t, "ok", fmt.Sprintf(`{"kvindexAddr": %q, "timeout": "10s"}`, d.GRPC))
	if err := ok.Produce(context.Background(), mm, eps); err != nil {
		t.Fatal(err)
	}
	if info := infoOf(t, eps[0], "ok"); info.CachedBlockCount() != 2 || info.TotalBlocks() != 4 || info.MM() == nil || info.MM().MatchBlocks != 0 {
		t.Errorf("multimodal: cached %d of %d, mm %v", info.CachedBlockCount(), info.TotalBlocks(), info.MM())
	}
}
