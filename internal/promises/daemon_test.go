package promises

import (
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/kvevents/event"
)

// The daemon's defaults the scenarios rely on: vLLM's block size, hash
// algorithm and seed without PYTHONHASHSEED (blockkeys.DefaultSeed), so the
// engine hashes the tests compute equal the daemon's keys without adding
// --hash-seed to the flags under test.
const (
	blockSize = 16
	model     = "org/model"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// Most scenarios spend their time waiting for a daemon's timers (pod
	// expiry, read and idle timeouts), not on CPU: run more of them at once
	// than the default of GOMAXPROCS, unless -parallel was given.
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", "8")
	}
	os.Exit(harness.Main(m))
}

// publish sends one vLLM batch on topic kv@pod@model.
func publish(t testing.TB, p *enginepub.Publisher, pod, model string, seq uint64, b *event.Batch) {
	t.Helper()
	payload, err := enginepub.EncodeVLLMBatch(b, enginepub.VLLMEncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish("kv@"+pod+"@"+model, seq, payload); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// prompt is nBlocks blocks of token ids distinct for every distinct base.
func prompt(base, nBlocks int) []uint32 {
	toks := make([]uint32, nBlocks*blockSize)
	for i := range toks {
		toks[i] = uint32(base*100_000 + i + 1)
	}
	return toks
}

// engineHashes are the block hashes a vLLM engine with the daemon's default
// key settings sends for tokens.
func engineHashes(t testing.TB, tokens []uint32) []uint64 {
	t.Helper()
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: blockkeys.DefaultSeed, BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	keys := h.Keys(nil, tokens, blockkeys.RequestExtras{})
	out := make([]uint64, len(keys))
	for i, k := range keys {
		out[i] = uint64(k)
	}
	return out
}

// stored is a batch of one BlockStored event of tokens with hashes.
func stored(hashes []uint64, tokens []uint32) *event.Batch {
	return &event.Batch{Events: []event.Event{{Kind: event.BlockStored, BlockHashes: hashes,
		TokenIDs: tokens, BlockSize: blockSize}}}
}

// rawDial opens a TCP connection to a tcp://host:port or host:port address.
func rawDial(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reports whether the peer closes c (EOF or reset) within d,
// reading and discarding whatever it sends first.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

// writeFile writes a file in t's temp dir and returns its path.
func writeFile(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
