package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents/event"
)

// makeRunKeys are the keys `make run` gives the daemon (--hash-seed 0).
var makeRunKeys = blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 16}

// ownKeys are the keys of model "own", configured apart in the daemon.
var ownKeys = blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "7", BlockSize: 16}

// daemonHTTP serves the daemon's HTTP API with make run's keys and a
// per-model override, optionally behind a token file.
func daemonHTTP(t *testing.T, tokenFile string) (string, *indexer.Indexer) {
	t.Helper()
	idx, err := indexer.New(context.Background(), indexer.Config{Keys: makeRunKeys, ModelKeys: map[string]blockkeys.KeyConfig{"own": ownKeys}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := api.Config{Indexer: idx, Logger: slog.New(slog.DiscardHandler)}
	if tokenFile != "" {
		if cfg.Auth, err = api.LoadTokens(tokenFile, nil); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := api.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return strings.TrimPrefix(hs.URL, "http://"), idx
}

func TestLoadgenKeysFromDaemon(t *testing.T) {
	addr, _ := daemonHTTP(t, "")
	d, err := daemonKeys(addr)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		o    options
		want blockkeys.KeyConfig
		warn string
	}{
		// The old defaults (seed "") made every block a parity mismatch
		// against make run's daemon.
		{name: "no flags: the daemon's", o: options{}, want: makeRunKeys},
		{name: "agreeing flags", o: options{algo: "sha256", seed: "0", blockSize: 16,
			set: map[string]bool{flagAlgo: true, flagSeed: true, flagBlockSize: true}}, want: makeRunKeys},
		{name: "a flag for a model of its own", o: options{model: "own", seed: "7", set: map[string]bool{flagSeed: true}}, want: ownKeys,
			warn: `--hash-seed "7" differs from the daemon's hash-seed "0": right only if model "own" has its own key config`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.o.httpAddr = addr
			if c.o.set == nil {
				c.o.set = map[string]bool{}
			}
			var warn bytes.Buffer
			got, err := resolveKeys(c.o, d, nil, &warn)
			if err != nil || got != c.want {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
			if c.warn == "" && warn.Len() > 0 || !strings.Contains(warn.String(), c.warn) {
				t.Fatalf("warning %q, want %q", warn.String(), c.warn)
			}
		})
	}
}

// Without the daemon's answer (down, or behind a token loadgen does not
// send) loadgen refuses to guess, unless all three flags say it all.
func TestLoadgenKeysWithoutDaemon(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("0123456789abcdef0123 read\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, _ := daemonHTTP(t, tokens)
	_, derr := daemonKeys(addr)
	if derr == nil || !strings.Contains(derr.Error(), "401") {
		t.Fatalf("status behind a token: %v", derr)
	}
	var warn bytes.Buffer
	o := options{httpAddr: addr, set: map[string]bool{flagSeed: true}, seed: "0"}
	if _, err := resolveKeys(o, nil, derr, &warn); err == nil || !strings.Contains(err.Error(), "give --hash-algo, --hash-seed and --block-size") {
		t.Fatalf("partial flags without the daemon: %v", err)
	}
	o.set = map[string]bool{flagAlgo: true, flagSeed: true, flagBlockSize: true}
	o.algo, o.blockSize = "sha256", 32
	if got, err := resolveKeys(o, nil, derr, &warn); err != nil || got != (blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 32}) {
		t.Fatalf("all flags without the daemon: %v, %v", got, err)
	}
}

// After publishing, loadgen asks the daemon whether its blocks matched: a
// model the daemon hashes otherwise stops the run with the cause, instead
// of measuring a fleet whose every block is a parity mismatch.
func TestLoadgenParityCheck(t *testing.T) {
	addr, idx := daemonHTTP(t, "")
	tokens := make([]uint32, 4*16)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	publishAs := func(pod, model string, keys blockkeys.KeyConfig) {
		h, err := blockkeys.NewHasher(keys)
		if err != nil {
			t.Fatal(err)
		}
		ev := event.Event{Kind: event.BlockStored, BlockSize: 16, TokenIDs: tokens}
		for _, k := range h.Keys(nil, tokens, blockkeys.RequestExtras{}) {
			ev.BlockHashes = append(ev.BlockHashes, uint64(k))
		}
		idx.Sink().Apply(context.Background(), &event.Batch{Pod: pod, Model: model, Events: []event.Event{ev}})
	}
	publishAs(podName(0), "loadgen/model", makeRunKeys)
	publishAs("someone-else", "loadgen/model", ownKeys) // not loadgen's pod: ignored
	if err := checkParity(options{httpAddr: addr, model: "loadgen/model"}, makeRunKeys, map[string]bool{podName(0): true}); err != nil {
		t.Fatalf("matching keys: %v", err)
	}
	publishAs(podName(1), "own", makeRunKeys) // the daemon hashes "own" with seed 7
	err := checkParity(options{httpAddr: addr, model: "own"}, makeRunKeys, map[string]bool{podName(1): true})
	if err == nil || !strings.Contains(err.Error(), `the daemon hashes model "own" otherwise than loadgen`) ||
		!strings.Contains(err.Error(), "4 blocks of its pods are parity mismatches") {
		t.Fatalf("mismatching keys: %v", err)
	}
}
