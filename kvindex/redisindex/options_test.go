package redisindex

import (
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
	"github.com/redis/go-redis/v9"
)

// call_timeout and loss_check: URL options with the Config fields over
// them, a Go duration or a number of seconds, 0 = the default for
// call_timeout and never for loss_check; out of range is an error naming
// the option, at parse time (the daemon's start) and in New/NewWithClient.
func TestCallTimeoutAndLossCheckOptions(t *testing.T) {
	good := []struct {
		url        string
		cfg        Config
		call, loss time.Duration
	}{
		{url: "redis://h:1", call: 0, loss: 0},
		{url: "redis://h:1?call_timeout=250ms&loss_check=5s", call: 250 * time.Millisecond, loss: 5 * time.Second},
		{url: "redis-cluster://h:1,h:2?call_timeout=2&loss_check=1h", call: 2 * time.Second, loss: time.Hour},
		{url: "redis://h:1?loss_check=0", loss: -1},
		{url: "redis://h:1?call_timeout=0", call: 0},
		{url: "redis://h:1?call_timeout=1m&loss_check=100ms", call: time.Minute, loss: 100 * time.Millisecond},
		{url: "redis://h:1?call_timeout=5s&loss_check=5s", cfg: Config{CallTimeout: time.Second, LossCheck: -1}, call: time.Second, loss: -1},
	}
	for _, g := range good {
		cfg := g.cfg
		cfg.URL = g.url
		if _, err := ParseIndexFlag(g.url); err != nil {
			t.Errorf("ParseIndexFlag(%q): %v", g.url, err)
		}
		o, err := cfg.universalOptions()
		if err != nil {
			t.Errorf("%q: %v", g.url, err)
			continue
		}
		if o.callTimeout != g.call || o.lossCheck != g.loss {
			t.Errorf("%q with %v/%v: call_timeout %v, loss_check %v, want %v, %v", g.url, g.cfg.CallTimeout, g.cfg.LossCheck, o.callTimeout, o.lossCheck, g.call, g.loss)
		}
	}
	for _, bad := range []struct{ url, want string }{
		{"redis://h:1?call_timeout=2m", "call_timeout"},
		{"redis://h:1?call_timeout=-1s", "call_timeout"},
		{"redis://h:1?call_timeout=soon", "call_timeout"},
		{"redis-cluster://h:1?call_timeout=61", "call_timeout"},
		{"redis://h:1?loss_check=10ms", "loss_check"},
		{"redis://h:1?loss_check=2h", "loss_check"},
		{"redis://h:1?loss_check=-1s", "loss_check"},
		{"redis-cluster://h:1?loss_check=often", "loss_check"},
	} {
		_, err := ParseIndexFlag(bad.url)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseIndexFlag(%q): %v, want an error naming %s", bad.url, err, bad.want)
		}
	}
	in := kvindex.NewInterner()
	for _, cfg := range []Config{{CallTimeout: 2 * time.Minute}, {CallTimeout: -time.Second}, {LossCheck: time.Millisecond}, {LossCheck: 2 * time.Hour}} {
		cfg.URL, cfg.Interner = "redis://127.0.0.1:1", in
		if _, err := New(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("New with CallTimeout %v, LossCheck %v: %v, want out of range", cfg.CallTimeout, cfg.LossCheck, err)
		}
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
		if _, err := NewWithClient(c, cfg); err == nil || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("NewWithClient with CallTimeout %v, LossCheck %v: %v, want out of range", cfg.CallTimeout, cfg.LossCheck, err)
		}
		c.Close()
	}
	// The index runs with what the URL says.
	srv := redistest.Start(t)
	idx, _ := newTestIndex(t, srv.URL()+"?call_timeout=300ms", nil)
	if idx.callTimeout != 300*time.Millisecond {
		t.Errorf("call_timeout=300ms: the index's call deadline is %v", idx.callTimeout)
	}
}
