package api

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/indexer/persist"
	"github.com/kvindex/kvindex/kvindex"
)

// GET /v1/admin/snapshot: refused (409, nothing streamed) to a peer whose
// block-key configuration differs; otherwise a copy that loads, naming this
// daemon's configuration; 503 while another copy streams.
func TestPeerSnapshotHandler(t *testing.T) {
	st := newStackWith(t, indexer.Config{Keys: testKeys}, func(c *Config) { c.AdminAPI = true })
	get := func(hashID string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, st.http.URL+indexer.PeerSnapshotPath, nil)
		if err != nil {
			t.Fatal(err)
		}
		if hashID != "" {
			req.Header.Set(indexer.HashConfigHeader, hashID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	resp, body := get("another-config")
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "block-key configuration") {
		t.Errorf("other configuration: %d %s, want 409 naming it", resp.StatusCode, body)
	}
	own := st.idx.HashConfigID()
	resp, body = get(own)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(indexer.HashConfigHeader) != own {
		t.Fatalf("same configuration: %d, header %q: %s", resp.StatusCode, resp.Header.Get(indexer.HashConfigHeader), body)
	}
	idx := kvindex.NewMemoryIndex(kvindex.MemoryConfig{})
	if _, err := persist.LoadFrom(bytes.NewReader(body), int64(len(body)), "copy", idx, kvindex.NewInterner(), persist.Limits{}); err != nil {
		t.Errorf("the copy does not load: %v", err)
	}
	st.srv.peerCopy <- struct{}{}
	resp, body = get(own)
	<-st.srv.peerCopy
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("while another copy streams: %d %s, want 503 with Retry-After", resp.StatusCode, body)
	}
}
