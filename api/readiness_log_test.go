package api

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testkit/logtest"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/prometheus/client_golang/prometheus"
)

// switchIndex is an in-memory index whose health check fails while down is
// set, as a Redis backend does while Redis is unreachable.
type switchIndex struct {
	*kvindex.MemoryIndex
	down *atomic.Bool
}

func (s switchIndex) Healthy(context.Context) error {
	if s.down.Load() {
		return errors.New("connection refused")
	}
	return nil
}

// The health check logs readiness changes only (once per flip, not per
// check, so a Redis outage is one line and not one per interval), and it
// logs them to the configured Logger.
func TestReadinessLogsEachChangeOnceToConfiguredLogger(t *testing.T) {
	var down atomic.Bool
	idx, err := indexer.New(context.Background(), indexer.Config{Keys: testKeys, Registry: prometheus.NewRegistry(),
		Backend: func(context.Context, *kvindex.Interner) (indexer.Backend, error) {
			s := switchIndex{kvindex.NewMemoryIndex(kvindex.MemoryConfig{}), &down}
			return indexer.Backend{Index: s, Health: s}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	var buf logtest.Buffer
	srv, err := New(Config{Indexer: idx, Registry: prometheus.NewRegistry(), Logger: buf.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	// down, down, up, up, down, down: not ready at start, so the first two
	// checks change nothing; then two flips.
	for i, d := range []bool{true, true, false, false, true, true} {
		down.Store(d)
		err := srv.CheckHealth(context.Background())
		if (err != nil) != d {
			t.Fatalf("check %d (down=%v): %v", i, d, err)
		}
		if ok, _ := srv.Ready(); ok == d {
			t.Fatalf("check %d (down=%v): Ready = %v", i, d, ok)
		}
	}
	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if i := strings.Index(line, `msg="`); i >= 0 {
			msg := line[i+len(`msg="`):]
			msgs = append(msgs, msg[:strings.IndexByte(msg, '"')])
		}
	}
	want := []string{"index healthy: ready", "index unhealthy: not ready"}
	if strings.Join(msgs, "|") != strings.Join(want, "|") {
		t.Fatalf("logged %q, want %q; log:\n%s", msgs, want, buf.String())
	}
}
