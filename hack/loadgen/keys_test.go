package main

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvindex"
)

// daemonHTTP serves the daemon's HTTP API (as make run configures it:
// seed "0") with a per-model override, optionally behind a token file.
func daemonHTTP(t *testing.T, tokenFile string) string {
	t.Helper()
	idx, err := indexer.New(context.Background(), indexer.Config{
		Keys:      kvindex.KeyConfig{Algo: kvindex.AlgoSHA256, Seed: "0", BlockSize: 16},
		ModelKeys: map[string]kvindex.KeyConfig{"big": {Algo: kvindex.AlgoXXHash, Seed: "7", BlockSize: 64}}})
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
	return strings.TrimPrefix(hs.URL, "http://")
}

func TestLoadgenKeysFromDaemon(t *testing.T) {
	addr := daemonHTTP(t, "")
	def := kvindex.KeyConfig{Algo: kvindex.AlgoSHA256, Seed: "0", BlockSize: 16}
	cases := []struct {
		name  string
		model string
		flags map[string]string // given on the command line
		want  kvindex.KeyConfig
		err   string
	}{
		// make run's daemon has seed "0": the old default seed "" made every
		// block a parity mismatch.
		{name: "no flags: the daemon's", model: "loadgen/model", want: def},
		{name: "agreeing flags", model: "loadgen/model", flags: map[string]string{flagAlgo: "sha256", flagSeed: "0", flagBlockSize: "16"}, want: def},
		{name: "the model's override", model: "big", want: kvindex.KeyConfig{Algo: kvindex.AlgoXXHash, Seed: "7", BlockSize: 64}},
		{name: "seed differs", model: "loadgen/model", flags: map[string]string{flagSeed: ""},
			err: `--hash-seed "", but the daemon at ` + addr + ` hashes model "loadgen/model" with hash-seed "0": every published block would be a parity mismatch`},
		{name: "algo differs", model: "loadgen/model", flags: map[string]string{flagAlgo: "xxhash"}, err: "with hash-algo sha256"},
		{name: "block size differs", model: "big", flags: map[string]string{flagBlockSize: "16"}, err: "--block-size 16, but the daemon"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := options{httpAddr: addr, model: c.model, set: map[string]bool{}}
			for f, v := range c.flags {
				o.set[f] = true
				switch f {
				case flagAlgo:
					o.algo = v
				case flagSeed:
					o.seed = v
				case flagBlockSize:
					var err error
					if o.blockSize, err = strconv.Atoi(v); err != nil {
						t.Fatal(err)
					}
				}
			}
			d, derr := daemonKeys(o.httpAddr, o.model)
			if derr != nil {
				t.Fatal(derr)
			}
			got, err := resolveKeys(o, d, derr)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %v, %v; want an error containing %q", got, err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
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
	addr := daemonHTTP(t, tokens)
	_, derr := daemonKeys(addr, "m")
	if derr == nil || !strings.Contains(derr.Error(), "401") {
		t.Fatalf("status behind a token: %v", derr)
	}
	o := options{httpAddr: addr, model: "m", set: map[string]bool{flagSeed: true}, seed: "0"}
	if _, err := resolveKeys(o, nil, derr); err == nil || !strings.Contains(err.Error(), "give --hash-algo, --hash-seed and --block-size") {
		t.Fatalf("partial flags without the daemon: %v", err)
	}
	o.set = map[string]bool{flagAlgo: true, flagSeed: true, flagBlockSize: true}
	o.algo, o.blockSize = "sha256", 32
	if got, err := resolveKeys(o, nil, derr); err != nil || got != (kvindex.KeyConfig{Algo: kvindex.AlgoSHA256, Seed: "0", BlockSize: 32}) {
		t.Fatalf("all flags without the daemon: %v, %v", got, err)
	}
}
