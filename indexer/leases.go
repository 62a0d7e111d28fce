package indexer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/kvindex/kvindex/indexer/internal/leases"
	"github.com/kvindex/kvindex/kvevents"
)

// LeaseConfig divides the connect-topology endpoint list (Config.Events
// Endpoints) between the daemons sharing one Redis index: each endpoint is
// subscribed by exactly one live daemon, through a lease in Redis.
// Acquiring a lease clears what the previous owner indexed from the
// endpoint and subscribes it; releasing it (rebalance, Redis lost,
// shutdown) unsubscribes and clears that endpoint's pods.
type LeaseConfig struct {
	Enabled bool
	// TTL is how long a dead daemon keeps its endpoints before another
	// takes them over (0 = Options.LeaseTTL's default).
	TTL time.Duration
	// DaemonID is this daemon's unique id ("" = hostname-pid).
	DaemonID string
}

// leaseLoop is the lease feature: the endpoints it divides and the loop
// that holds this daemon's share of them.
type leaseLoop struct {
	indexer *Indexer
	ttl     time.Duration
	byAddr  map[string]kvevents.EndpointConfig
	addrs   []string
	lm      *leases.Manager
	to      *leases.Takeover
	log     *slog.Logger
}

func (ix *Indexer) newLeaseLoop(cfg LeaseConfig, eps []kvevents.EndpointConfig) (*leaseLoop, error) {
	r := ix.backend.redis
	if r == nil {
		return nil, errors.New("indexer: leases need the shared Redis index")
	}
	if len(eps) == 0 {
		return nil, errors.New("indexer: leases: no endpoint to share (leases divide the connect-topology endpoint list)")
	}
	id := cfg.DaemonID
	if id == "" {
		host, _ := os.Hostname()
		id = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	l := &leaseLoop{indexer: ix, ttl: cfg.TTL, byAddr: make(map[string]kvevents.EndpointConfig, len(eps)),
		log: ix.log.With("component", "leases", "daemon_id", id)}
	for _, ep := range eps {
		l.byAddr[ep.Address] = ep
		l.addrs = append(l.addrs, ep.Address)
	}
	l.lm = leases.NewManager(r.Client(), r.Namespace(), id, cfg.TTL)
	l.lm.SetLogger(l.log)
	l.to = leases.NewTakeover(r.Client(), r.Namespace())
	l.log.Info("leases on", "endpoints", len(l.addrs), "ttl", cfg.TTL)
	return l, nil
}

// run holds leases until ctx is done, then releases them.
func (l *leaseLoop) run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	trackCtx, stop := context.WithCancel(ctx)
	defer stop()
	sub := l.indexer.sub
	// Record which pods this daemon indexes from the endpoints it holds:
	// the daemon that takes one over clears them. At most every second: a
	// pod first seen less than one interval before this daemon dies is not
	// recorded, so keep that short.
	wg.Go(func() {
		l.to.Track(trackCtx, min(l.ttl/3, time.Second), l.lm.Held, l.podsByEndpoint, func(err error) {
			l.log.Warn("recording the pods of held endpoints failed", "err", err)
		})
	})
	return l.lm.Run(ctx, func() []string { return l.addrs },
		func(ctx context.Context, ep string) error {
			if err := l.to.Prepare(ctx, ep, l.byAddr[ep].Pod, l.indexer.backend.redis); err != nil {
				return err
			}
			if err := sub.AddEndpoint(l.byAddr[ep]); err != nil {
				return fmt.Errorf("subscribe: %w", err)
			}
			l.log.Info("lease acquired: previous owner's pods cleared, subscribed", "endpoint", ep)
			return nil
		},
		func(ep string) {
			if err := sub.RemoveEndpoint(ep); err != nil {
				l.log.Warn("lease released: remove endpoint", "endpoint", ep, "err", err)
				return
			}
			l.log.Info("lease released: unsubscribed and cleared", "endpoint", ep)
		})
}

// podsByEndpoint maps each endpoint to the pod names of the streams that
// arrived through it.
func (l *leaseLoop) podsByEndpoint() map[string][]string {
	out := map[string][]string{}
	for _, st := range l.indexer.sub.Streams() {
		out[st.Endpoint] = append(out[st.Endpoint], st.Pod)
	}
	return out
}
