package api

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/grpcbuf"
	"github.com/kvindex/kvindex/kvevents/event"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// BenchmarkGRPCRoundTrip is the whole request path in one process, client
// and server, over TCP loopback and a unix socket: an empty call (health
// Check, the transport's floor) and warm scores of 1k, 8k and 32k token ids
// (vLLM's block size 16, 8 pods, ids below 150,000 as a tokenizer's),
// sent as varints (ids) and as little-endian bytes (packed). A CPU
// profile of it splits the cost between the client, the transport and the
// daemon (docs/performance.md).
func BenchmarkGRPCRoundTrip(b *testing.B) {
	keys := blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 16}
	idx, err := indexer.New(context.Background(), indexer.Config{Keys: keys})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(Config{Indexer: idx, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	h, err := blockkeys.NewHasher(keys)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	prompts := map[int][]uint32{}
	for _, n := range []int{1024, 8192, 32768} {
		p := make([]uint32, n)
		for i := range p {
			p[i] = uint32(rng.IntN(150000))
		}
		prompts[n] = p
		ks := h.Keys(nil, p, blockkeys.RequestExtras{})
		for pod := range 8 {
			nb := len(ks) - pod*len(ks)/16
			ev := event.Event{Kind: event.BlockStored, BlockSize: 16, TokenIDs: p[:nb*16]}
			for _, k := range ks[:nb] {
				ev.BlockHashes = append(ev.BlockHashes, uint64(k))
			}
			idx.Sink().Apply(context.Background(), &event.Batch{Pod: fmt.Sprintf("pod-%d", pod), Model: "m", Events: []event.Event{ev}})
		}
	}
	dir, err := os.MkdirTemp("", "kvb")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	for _, tr := range []struct{ name, addr string }{{"tcp", "127.0.0.1:0"}, {"unix", UnixPrefix + filepath.Join(dir, "k.sock")}} {
		ln, err := Listen(tr.addr)
		if err != nil {
			b.Fatal(err)
		}
		gs := srv.NewGRPCServer()
		go func() { _ = gs.Serve(ln) }()
		target := tr.addr
		if tr.name == "tcp" {
			target = ln.Addr().String()
		}
		// The Go client's options (client.New).
		conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
			experimental.WithBufferPool(grpcbuf.Pool), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(grpcbuf.Codec)))
		if err != nil {
			b.Fatal(err)
		}
		health, c := healthpb.NewHealthClient(conn), kvindexv1.NewIndexerClient(conn)
		b.Run(tr.name+"/floor", func(b *testing.B) {
			for b.Loop() {
				if _, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		for _, n := range []int{1024, 8192, 32768} {
			for _, field := range []string{"ids", "packed"} {
				ids := &kvindexv1.TokenIDs{Ids: prompts[n]}
				if field == "packed" {
					ids = &kvindexv1.TokenIDs{Packed: kvindexv1.PackTokenIDs(prompts[n])}
				}
				req := &kvindexv1.ScoreRequest{Model: "m", Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: ids}}
				b.Run(fmt.Sprintf("%s/%s/tokens=%d", tr.name, field, n), func(b *testing.B) {
					for b.Loop() {
						resp, err := c.Score(context.Background(), req)
						if err != nil || len(resp.Pods) != 8 {
							b.Fatal(resp, err)
						}
					}
				})
			}
		}
		conn.Close()
		gs.Stop()
	}
}
