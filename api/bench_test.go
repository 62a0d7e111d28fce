package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/tracing"
	"github.com/kvindex/kvindex/kvevents/event"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// benchStack fills an in-memory stack with pods holding prefixes of
// decreasing length of one prompt of 512 blocks (of testBlock tokens). It
// runs on b so the servers it starts are stopped when the benchmark ends.
func benchStack(b *testing.B, pods int) (*stack, []uint32) {
	return benchStackTraced(b, pods, nil)
}

// benchStackTraced is benchStack with tr given to the indexer and the API
// (nil = tracing off).
func benchStackTraced(b *testing.B, pods int, tr *tracing.Tracer) (*stack, []uint32) {
	st := newStackWith(b, indexer.Config{Keys: testKeys, Tracer: tr}, func(c *Config) { c.Tracer = tr })
	prompt := seqTokens(7, 512*testBlock)
	for p := 0; p < pods; p++ {
		st.store(fmt.Sprintf("pod-%02d", p), 0, event.TierGPU, prompt, 512-p*(512/pods)/2, blockkeys.RequestExtras{})
	}
	return st, prompt
}

// BenchmarkHTTPScoreHandler is the HTTP score path without the network:
// JSON decode of 512 blocks of token ids, hashing, lookup, JSON encode.
func BenchmarkHTTPScoreHandler(b *testing.B) {
	st, prompt := benchStack(b, 8)
	body, _ := json.Marshal(map[string]any{"model": testModel, "token_ids": prompt})
	h := st.srv.Handler()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := httptest.NewRequest(http.MethodPost, "/v1/score", bytes.NewReader(body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatal(w.Body.String())
		}
	}
}

// BenchmarkGRPCScoreMethod is the gRPC Score method without transport.
func BenchmarkGRPCScoreMethod(b *testing.B) {
	st, prompt := benchStack(b, 8)
	req := &kvindexv1.ScoreRequest{Model: testModel, Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: prompt}}}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := st.srv.Score(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGRPCScoreHashes is Score with block hashes: no hashing, so this
// is the API overhead over the index lookup.
func BenchmarkGRPCScoreHashes(b *testing.B) {
	st, prompt := benchStack(b, 8)
	keys := st.hashers.For(testModel).Keys(nil, prompt, blockkeys.RequestExtras{})
	hs := make([]uint64, len(keys))
	for i, k := range keys {
		hs[i] = uint64(k)
	}
	req := &kvindexv1.ScoreRequest{Model: testModel, Input: &kvindexv1.ScoreRequest_BlockHashes{BlockHashes: &kvindexv1.BlockHashes{Hashes: hs}}}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := st.srv.Score(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}
