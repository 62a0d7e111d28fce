package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// BenchmarkHTTPPickHandler is the HTTP pick path without the network:
// JSON decode of 512 blocks of token ids and 8 candidates, hashing,
// lookup, policy, JSON encode; the counterpart of BenchmarkHTTPScoreHandler.
func BenchmarkHTTPPickHandler(b *testing.B) {
	st, prompt := benchStack(b, 8)
	var cands []map[string]any
	for p := 0; p < 8; p++ {
		cands = append(cands, map[string]any{"pod": fmt.Sprintf("pod-%02d", p), "running": p, "waiting": p % 2, "kv_usage": 0.1})
	}
	body, _ := json.Marshal(map[string]any{"model": testModel, "token_ids": prompt, "candidates": cands})
	h := st.srv.Handler()
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/v1/pick", bytes.NewReader(body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatal(w.Body.String())
		}
	}
}

// BenchmarkGRPCPickMethod is the gRPC Pick method without transport.
func BenchmarkGRPCPickMethod(b *testing.B) {
	st, prompt := benchStack(b, 8)
	req := &kvindexv1.PickRequest{Model: testModel, Input: &kvindexv1.PickRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: prompt}}}
	for p := 0; p < 8; p++ {
		req.Candidates = append(req.Candidates, &kvindexv1.Candidate{Pod: fmt.Sprintf("pod-%02d", p), Running: int32(p)})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := st.srv.Pick(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}
