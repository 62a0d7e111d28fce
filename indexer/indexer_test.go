package indexer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/race"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

const (
	testModel = "test/model"
	testBlock = 4
)

var testKeys = blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: testBlock}

// flakyIndex is a memory index whose writes and reads fail on demand, as a
// Redis backend does while Redis is unreachable; it counts PodBlocks reads
// and answers them in batches when batch is set.
type flakyIndex struct {
	*kvindex.MemoryIndex
	failRemove atomic.Bool
	down       atomic.Bool
	podReads   atomic.Int32
	batchReads atomic.Int32
}

var errDown = errors.New("backend down")

func (f *flakyIndex) Remove(ctx context.Context, m kvindex.ModelID, p kvindex.PodID, t event.Tier, keys []blockkeys.Key) error {
	if f.failRemove.Load() || f.down.Load() {
		return errDown
	}
	return f.MemoryIndex.Remove(ctx, m, p, t, keys)
}

func (f *flakyIndex) Lookup(ctx context.Context, m kvindex.ModelID, keys []blockkeys.Key, v kvindex.Visitor) error {
	if f.down.Load() {
		return errDown
	}
	return f.MemoryIndex.Lookup(ctx, m, keys, v)
}

// ScorePrefix shadows the embedded index's fused scorer: a backend that is
// down must fail on that path too, not only on Lookup.
func (f *flakyIndex) ScorePrefix(ctx context.Context, m kvindex.ModelID, keys []blockkeys.Key, cands []kvindex.PodID, w kvindex.TierWeights, res *kvindex.ScoreResult) error {
	if f.down.Load() {
		return errDown
	}
	return f.MemoryIndex.ScorePrefix(ctx, m, keys, cands, w, res)
}

func (f *flakyIndex) PodBlocks(ctx context.Context, p kvindex.PodID) (int64, error) {
	f.podReads.Add(1)
	if f.down.Load() {
		return 0, errDown
	}
	return f.MemoryIndex.PodBlocks(ctx, p)
}

func (f *flakyIndex) Healthy(context.Context) error {
	if f.down.Load() {
		return errDown
	}
	return nil
}

// batchingIndex adds the batched read to flakyIndex.
type batchingIndex struct{ *flakyIndex }

func (b batchingIndex) PodBlocksBatch(ctx context.Context, pods []kvindex.PodID, out []int64) error {
	b.batchReads.Add(1)
	if b.down.Load() {
		return errDown
	}
	for i, p := range pods {
		n, err := b.MemoryIndex.PodBlocks(ctx, p)
		if err != nil {
			return err
		}
		out[i] = n
	}
	return nil
}

func newTestIndexer(t testing.TB, cfg Config) *Indexer {
	t.Helper()
	cfg.Keys = testKeys
	ix, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ix.Close() })
	return ix
}

// withBackend is a custom backend with no optional capability.
func withBackend(idx kvindex.Index) BackendFunc {
	return func(context.Context, *kvindex.Interner) (Backend, error) { return Backend{Index: idx}, nil }
}

// flakyBackend declares what flakyIndex can do: fail (Health) and score
// prefixes itself; batched adds the batched pod-blocks read.
func flakyBackend(f *flakyIndex, batched bool) BackendFunc {
	return func(context.Context, *kvindex.Interner) (Backend, error) {
		b := Backend{Index: f, Health: f, Prefix: f}
		if batched {
			bi := batchingIndex{f}
			b.Index, b.Batch = bi, bi
		}
		return b, nil
	}
}

func seqTokens(start, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(start + i)
	}
	return t
}

var testHashers = func() *blockkeys.HasherSet {
	hs, err := blockkeys.NewHasherSet(testKeys, nil)
	if err != nil {
		panic(err)
	}
	return hs
}()

// blockHashes are the engine hashes of tokens' full blocks, computed with a
// hasher of the indexer's config (so parity matches).
func blockHashes(tokens []uint32, extras blockkeys.RequestExtras) []uint64 {
	var out []uint64
	for _, k := range testHashers.For(testModel).Keys(nil, tokens, extras) {
		out = append(out, uint64(k))
	}
	return out
}

func storeEvent(tokens []uint32, n int, tier event.Tier) event.Event {
	return event.Event{Kind: event.BlockStored, BlockSize: testBlock, TokenIDs: tokens[:n*testBlock],
		Medium: tier, BlockHashes: blockHashes(tokens, blockkeys.RequestExtras{})[:n]}
}

func apply(ix *Indexer, pod string, rank int, evs ...event.Event) {
	ix.Sink().Apply(context.Background(), &event.Batch{Pod: pod, Model: testModel, DPRank: rank, Events: evs})
}

// summary renders a result as "pod:blocks/tokens/score[rank:blocks,...]".
func summary(r *Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "total=%d", r.TotalBlocks)
	for _, p := range r.Pods {
		fmt.Fprintf(&b, " %s:%d/%d/%.2f[", p.Pod, p.MatchedBlocks, p.MatchedTokens, p.Score)
		for _, rk := range p.Ranks {
			fmt.Fprintf(&b, "%d:%d,", rk.DPRank, rk.MatchedBlocks)
		}
		b.WriteString("]")
	}
	return b.String()
}

func mustScore(t *testing.T, ix *Indexer, q *Query, r *Result) string {
	t.Helper()
	if err := ix.Score(context.Background(), q, r); err != nil {
		t.Fatalf("Score(%+v): %v", q, err)
	}
	return summary(r)
}

// Ranks of one pod fold into one entry (best rank decides), pods sort by
// score then blocks, tiers weigh, and block hashes equal token ids.
func TestScoreAggregatesRanksAndSorts(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	prompt := seqTokens(1000, 10*testBlock+2) // 10 full blocks + a partial one
	apply(ix, "pod-a", 0, storeEvent(prompt, 6, event.TierGPU))
	apply(ix, "pod-b", 0, storeEvent(prompt, 8, event.TierCPU))
	apply(ix, "pod-c", 0, storeEvent(prompt, 2, event.TierGPU))
	apply(ix, "pod-c", 1, storeEvent(prompt, 7, event.TierGPU))
	apply(ix, "pod-d", 0, storeEvent(seqTokens(5000, 8*testBlock), 8, event.TierGPU))

	var r Result
	// pod-c rank 1: 7 GPU blocks = 7.0; pod-b: 8 CPU blocks = 6.4; pod-a: 6.0.
	want := "total=10 pod-c:7/28/7.00[1:7,0:2,] pod-b:8/32/6.40[0:8,] pod-a:6/24/6.00[0:6,]"
	if got := mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}, &r); got != want {
		t.Fatalf("tokens:\n got %s\nwant %s", got, want)
	}
	if r.BlockSize != testBlock || r.Pods[1].Tiers[event.TierCPU] != 8 || r.Pods[1].Tiers[event.TierGPU] != 0 {
		t.Errorf("block size %d, pod-b tiers %v", r.BlockSize, r.Pods[1].Tiers)
	}
	// The same Result reused: block hashes are the same keys, same answer.
	q := Query{Model: testModel, Kind: InputHashes, BlockHashes: blockHashes(prompt, blockkeys.RequestExtras{})}
	if got := mustScore(t, ix, &q, &r); got != want {
		t.Fatalf("hashes:\n got %s\nwant %s", got, want)
	}
	// Pod filter: every DP rank of the named pods, nothing else; a filter
	// naming only unknown pods and an unknown model answer empty.
	q.Pods = []string{"pod-a", "pod-c", "nope"}
	if got, want := mustScore(t, ix, &q, &r), "total=10 pod-c:7/28/7.00[1:7,0:2,] pod-a:6/24/6.00[0:6,]"; got != want {
		t.Fatalf("filtered:\n got %s\nwant %s", got, want)
	}
	q.Pods = []string{"nope"}
	if got := mustScore(t, ix, &q, &r); got != "total=10" {
		t.Fatalf("unknown pod filter: %s", got)
	}
	if got := mustScore(t, ix, &Query{Model: "other", Kind: InputTokens, TokenIDs: prompt}, &r); got != "total=10" {
		t.Fatalf("unknown model: %s", got)
	}
	if ix.PodRanks("pod-c") != 2 || ix.PodRanks("pod-a") != 1 || ix.PodRanks("nope") != 0 {
		t.Errorf("PodRanks = %d %d %d", ix.PodRanks("pod-c"), ix.PodRanks("pod-a"), ix.PodRanks("nope"))
	}
}

// A pod whose index write failed is left out of scores and listed untrusted
// and incomplete ("index_error"), as the subscriber records the sink's
// outcome; once the index is back the subscriber's recovery clears the
// quiet pod and serves it again with nothing of what it held, and its next
// batch is scored.
func TestUntrustedPodIsLeftOutOfScores(t *testing.T) {
	keys := blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 4}
	f := &flakyIndex{MemoryIndex: kvindex.NewMemoryIndex(kvindex.MemoryConfig{})}
	ix, pub := runEventIndexer(t, keys, f, 1)
	tokens := seqTokens(100, 4*4)
	publishBatch(t, pub, keys, "pod-a", 0, 0, tokens[:2*4])
	publishBatch(t, pub, keys, "pod-b", 0, 0, tokens)
	q := &Query{Model: "org/model", Kind: InputTokens, TokenIDs: tokens}
	scoreUntil(t, ix, q, "both pods scored", func(r *Result) bool {
		return podOf(r, "pod-a") != nil && podOf(r, "pod-b") != nil && podOf(r, "pod-b").MatchedBlocks == 4
	})

	f.failRemove.Store(true)
	h, _ := blockkeys.NewHasher(keys)
	var hs []uint64
	for _, k := range h.Keys(nil, tokens, blockkeys.RequestExtras{}) {
		hs = append(hs, uint64(k))
	}
	p, err := enginepub.EncodeVLLMBatch(&event.Batch{Events: []event.Event{{Kind: event.BlockRemoved, BlockHashes: hs[2:]}}},
		enginepub.VLLMEncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("kv@pod-b@org/model", 1, p); err != nil {
		t.Fatal(err)
	}
	scoreUntil(t, ix, q, "pod-b left out", func(r *Result) bool { return podOf(r, "pod-b") == nil && podOf(r, "pod-a") != nil })
	// The index still holds pod-b's 4 blocks: only the trust filter hides them.
	if id, _ := ix.in.LookupPod("pod-b", 0); mustBlocks(t, f, id) != 4 {
		t.Fatal("the failed removal changed the index; the test no longer shows the filter")
	}
	pods := ix.Pods(context.Background(), nil)
	if len(pods) != 2 || !pods[1].Untrusted || pods[0].Untrusted {
		t.Fatalf("listing does not show pod-b untrusted: %+v", pods)
	}

	// Index back: the recovery clears the quiet pod-b; it is served again,
	// with nothing, and stays incomplete until rebuilt.
	f.failRemove.Store(false)
	deadline := time.Now().Add(30 * time.Second)
	for {
		p := ix.Pods(context.Background(), nil)
		if len(p) == 2 && !p[1].Untrusted && p[1].Blocks == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod-b never recovered: %+v", p)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, st := range ix.Subscriber().Streams() {
		if st.Pod == "pod-b" && (st.Complete || st.IncompleteReason != "index_error") {
			t.Fatalf("pod-b's stream after the recovery: %+v", st)
		}
	}
	publishBatch(t, pub, keys, "pod-b", 0, 2, tokens[:4])
	r := scoreUntil(t, ix, q, "pod-b's next batch scored", func(r *Result) bool { return podOf(r, "pod-b") != nil })
	if b := podOf(r, "pod-b"); b.MatchedBlocks != 1 || b.Complete || b.IncompleteReason != "index_error" {
		t.Fatalf("pod-b after recovery: %+v", *b)
	}
}

func mustBlocks(t *testing.T, idx kvindex.Index, id kvindex.PodID) int64 {
	t.Helper()
	n, err := idx.PodBlocks(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type fakeTokenizer struct{ err error }

// TokenizeRendered: the fake has no special tokens to leave out.
func (f fakeTokenizer) TokenizeRendered(ctx context.Context, model, prompt string) ([]uint32, error) {
	return f.TokenizePrompt(ctx, model, prompt)
}

func (f fakeTokenizer) TokenizePrompt(ctx context.Context, _, prompt string) ([]uint32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if f.err != nil {
		return nil, f.err
	}
	out := make([]uint32, len(prompt))
	for i := range prompt {
		out[i] = uint32(prompt[i])
	}
	return out, nil
}

func TestScoreErrors(t *testing.T) {
	f := &flakyIndex{MemoryIndex: kvindex.NewMemoryIndex(kvindex.MemoryConfig{})}
	ix := newTestIndexer(t, Config{Backend: flakyBackend(f, false)})
	apply(ix, "pod-a", 0, storeEvent(seqTokens(1, 8), 2, event.TierGPU))
	m := testModel
	long := make([]uint32, MaxInputLen+1)
	cases := []struct {
		q      Query
		code   Code
		reason string
	}{
		{Query{Model: m}, InvalidArgument, "one of token_ids"},
		{Query{Model: m, Kind: InputTokens}, InvalidArgument, "token_ids is empty"},
		{Query{Model: m, Kind: InputTokens, TokenIDs: long}, InvalidArgument, "limit"},
		{Query{Model: m, Kind: InputHashes}, InvalidArgument, "block_hashes is empty"},
		{Query{Model: m, Kind: InputHashes, BlockHashes: []uint64{1}, LoraName: "a"}, InvalidArgument, "lora_name"},
		{Query{Kind: InputTokens, TokenIDs: []uint32{1}}, InvalidArgument, "model is required"},
		{Query{Kind: InputPrompt, Prompt: "x"}, InvalidArgument, "model is required"},
		{Query{Model: m, Kind: InputPrompt}, InvalidArgument, "prompt is empty"},
		{Query{Model: m, Kind: InputTokens, TokenIDs: []uint32{1}, Pods: []string{""}}, InvalidArgument, "empty name"},
		{Query{Model: m, Kind: InputPrompt, Prompt: "hello"}, FailedPrecondition, "not configured"},
	}
	var r Result
	for _, c := range cases {
		err := ix.Score(context.Background(), &c.q, &r)
		var e *Error
		if !errors.As(err, &e) || e.Code != c.code || !strings.Contains(e.Msg, c.reason) {
			t.Errorf("%+v: got %v, want %v containing %q", c.q, err, c.code, c.reason)
		}
	}

	// A backend that is down is Unavailable, even when nothing could match.
	f.down.Store(true)
	for _, q := range []Query{
		{Model: m, Kind: InputTokens, TokenIDs: seqTokens(1, 8)},
		{Model: "unknown", Kind: InputTokens, TokenIDs: seqTokens(1, 8)},
	} {
		var e *Error
		if err := ix.Score(context.Background(), &q, &r); !errors.As(err, &e) || e.Code != Unavailable {
			t.Errorf("down backend, model %s: %v, want Unavailable", q.Model, err)
		}
	}
}

func TestScorePrompt(t *testing.T) {
	ix := newTestIndexer(t, Config{Tokenizer: fakeTokenizer{}})
	prompt := "abcdefgh" // two blocks of the fake tokenizer's bytes
	apply(ix, "pod-a", 0, storeEvent(seqTokens('a', 8), 2, event.TierGPU))
	var r Result
	if got := mustScore(t, ix, &Query{Model: testModel, Kind: InputPrompt, Prompt: prompt}, &r); got != "total=2 pod-a:2/8/2.00[0:2,]" {
		t.Fatalf("prompt: %s", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var e *Error
	if err := ix.Score(ctx, &Query{Model: testModel, Kind: InputPrompt, Prompt: prompt}, &r); !errors.As(err, &e) || e.Code != Canceled {
		t.Fatalf("canceled: %v", err)
	}
	bad := newTestIndexer(t, Config{Tokenizer: fakeTokenizer{err: errors.New("no tokenizer for test/model")}})
	if err := bad.Score(context.Background(), &Query{Model: testModel, Kind: InputPrompt, Prompt: prompt}, &r); !errors.As(err, &e) ||
		e.Code != FailedPrecondition || !strings.Contains(e.Msg, "no tokenizer") {
		t.Fatalf("tokenizer error: %v", err)
	}
}

// Pods lists applier pods and caller-named pods once each, sorted, with
// block counts read in one batch when the backend can; -1 when it is down.
func TestPodsListing(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprint("batched=", batched), func(t *testing.T) {
			f := &flakyIndex{MemoryIndex: kvindex.NewMemoryIndex(kvindex.MemoryConfig{})}
			ix := newTestIndexer(t, Config{Backend: flakyBackend(f, batched)})
			apply(ix, "pod-b", 0, storeEvent(seqTokens(1, 12), 3, event.TierGPU))
			apply(ix, "pod-a", 1, storeEvent(seqTokens(1, 12), 1, event.TierGPU))
			apply(ix, "pod-a", 0, storeEvent(seqTokens(1, 12), 2, event.TierGPU))
			also := []PodRef{{"pod-b", 0}, {"pod-z", 0}, {"pod-z", 0}}
			render := func(ps []PodStatus) string {
				var b strings.Builder
				for _, p := range ps {
					fmt.Fprintf(&b, "%s/%d:%d:%v ", p.Stats.Pod, p.Stats.DPRank, p.Blocks, p.Applied)
				}
				return b.String()
			}
			if got, want := render(ix.Pods(context.Background(), also)), "pod-a/0:2:true pod-a/1:1:true pod-b/0:3:true pod-z/0:0:false "; got != want {
				t.Fatalf("listing:\n got %s\nwant %s", got, want)
			}
			if batched && (f.batchReads.Load() != 1 || f.podReads.Load() != 0) {
				t.Errorf("batched backend: %d batch reads, %d single reads; want 1, 0", f.batchReads.Load(), f.podReads.Load())
			}
			if !batched && f.podReads.Load() != 3 {
				t.Errorf("single reads = %d, want 3 (one per interned pod)", f.podReads.Load())
			}
			f.down.Store(true)
			if got, want := render(ix.Pods(context.Background(), also)), "pod-a/0:-1:true pod-a/1:-1:true pod-b/0:-1:true pod-z/0:0:false "; got != want {
				t.Fatalf("listing with backend down:\n got %s\nwant %s", got, want)
			}
		})
	}
}

// The backend factory receives the indexer's interner: ids the backend sees
// are the ids the applier and scorer use.
func TestBackendGetsTheOneInterner(t *testing.T) {
	var got *kvindex.Interner
	ix := newTestIndexer(t, Config{Backend: func(_ context.Context, in *kvindex.Interner) (Backend, error) {
		got = in
		return MemoryBackend(kvindex.NewMemoryIndex(kvindex.MemoryConfig{})), nil
	}})
	if got == nil || got != ix.in {
		t.Fatal("backend factory was not handed the indexer's interner")
	}
	_, err := New(context.Background(), Config{Keys: testKeys, Backend: func(context.Context, *kvindex.Interner) (Backend, error) {
		return Backend{}, errDown
	}})
	if !errors.Is(err, errDown) {
		t.Fatalf("factory error not returned: %v", err)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	ix := newTestIndexer(t, Config{Registry: reg})
	apply(ix, "pod-a", 1, storeEvent(seqTokens(1, 8), 2, event.TierGPU))
	var r Result
	mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens(1, 8)}, &r)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
			got[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = fmt.Sprint(v)
		}
	}
	for k, want := range map[string]string{
		"kvindexd_index_entries{}": "2",
		"kvindexd_pod_blocks_stored_total{dp_rank=1,model=test/model,pod=pod-a}": "2",
		"kvindexd_pod_untrusted{dp_rank=1,model=test/model,pod=pod-a}":           "0",
		"kvindexd_score_lookup_seconds{}":                                        "1",
		"kvindexd_score_tokens{}":                                                "1",
	} {
		if got[k] != want {
			t.Errorf("%s = %q, want %s", k, got[k], want)
		}
	}
}

// Scoring into a reused Result allocates nothing on the block-hash path
// (no hashing), so a busy router's steady state makes no garbage.
func TestScoreReusedResultDoesNotAllocate(t *testing.T) {
	if race.Enabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	ix := newTestIndexer(t, Config{})
	prompt := seqTokens(7, 64*testBlock)
	for p := 0; p < 4; p++ {
		apply(ix, fmt.Sprintf("pod-%d", p), p%2, storeEvent(prompt, 64-p*8, event.TierGPU))
	}
	q := &Query{Model: testModel, Kind: InputHashes, BlockHashes: blockHashes(prompt, blockkeys.RequestExtras{})}
	var r Result
	mustScore(t, ix, q, &r)
	allocs := testing.AllocsPerRun(50, func() {
		if err := ix.Score(context.Background(), q, &r); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Score allocates %.1f times per call, want 0", allocs)
	}
}

// benchIndexer holds 8 pods with prefixes of decreasing length of one
// prompt of 512 blocks.
func benchIndexer(b *testing.B) (*Indexer, []uint32) {
	ix := newTestIndexer(b, Config{})
	prompt := seqTokens(7, 512*testBlock)
	for p := 0; p < 8; p++ {
		apply(ix, fmt.Sprintf("pod-%02d", p), 0, storeEvent(prompt, 512-p*32, event.TierGPU))
	}
	return ix, prompt
}

// BenchmarkScoreTokens is Score from 512 blocks of token ids: hashing,
// lookup, aggregation, into a reused Result.
func BenchmarkScoreTokens(b *testing.B) {
	ix, prompt := benchIndexer(b)
	benchScore(b, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt})
}

// BenchmarkScoreHashes is Score from 512 block hashes: lookup and
// aggregation only.
func BenchmarkScoreHashes(b *testing.B) {
	ix, prompt := benchIndexer(b)
	benchScore(b, ix, &Query{Model: testModel, Kind: InputHashes, BlockHashes: blockHashes(prompt, blockkeys.RequestExtras{})})
}

func benchScore(b *testing.B, ix *Indexer, q *Query) {
	var r Result
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := ix.Score(context.Background(), q, &r); err != nil {
			b.Fatal(err)
		}
	}
}

// Configured tier weights replace the defaults, zeros included.
func TestTierWeights(t *testing.T) {
	w := kvindex.DefaultTierWeights()
	// shared 0 too: a shared weight above gpu's is refused (storage.go)
	w[event.TierCPU], w[event.TierGPU], w[event.TierShared] = 2, 0, 0
	ix := newTestIndexer(t, Config{TierWeights: &w})
	prompt := seqTokens(1, 4*testBlock)
	apply(ix, "pod-gpu", 0, storeEvent(prompt, 4, event.TierGPU))
	apply(ix, "pod-cpu", 0, storeEvent(prompt, 3, event.TierCPU))
	var r Result
	if got, want := mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}, &r),
		"total=4 pod-cpu:3/12/6.00[0:3,] pod-gpu:4/16/0.00[0:4,]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}
