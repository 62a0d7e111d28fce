package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvindex/redisindex"
	"github.com/kvindex/kvindex/leases"
)

// setupLeases prepares the connect-topology lease loop (--leases): the
// configured endpoint list is shared by every daemon on one Redis index, and
// each endpoint is subscribed by exactly one live daemon, through a lease in
// Redis. Acquiring a lease clears what the previous owner indexed from the
// endpoint (leases.Takeover) and subscribes it; releasing it (rebalance,
// Redis lost, shutdown) unsubscribes and clears that endpoint's pods.
func (d *daemon) setupLeases(eps []kvevents.EndpointConfig) error {
	idx, ok := d.index.(*redisindex.Index)
	if !ok {
		return errors.New("--leases needs a shared index: set --index to a redis:// or redis-cluster:// URL")
	}
	if len(eps) == 0 {
		return errors.New("--leases: no --endpoint to share (leases divide the connect-topology endpoint list)")
	}
	ttl, err := time.ParseDuration(d.cfg.LeaseTTL)
	if err != nil || ttl <= 0 {
		return fmt.Errorf("--lease-ttl %q: want a positive duration such as 10s", d.cfg.LeaseTTL)
	}
	id := d.cfg.DaemonID
	if id == "" {
		host, _ := os.Hostname()
		id = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	byAddr := make(map[string]kvevents.EndpointConfig, len(eps))
	addrs := make([]string, 0, len(eps))
	for _, ep := range eps {
		byAddr[ep.Address] = ep
		addrs = append(addrs, ep.Address)
	}
	log := d.log.With("component", "leases", "daemon_id", id)
	lm := leases.NewManager(idx.Client(), idx.Namespace(), id, ttl)
	lm.SetLogger(log)
	to := leases.NewTakeover(idx.Client(), idx.Namespace())
	d.leases = func(ctx context.Context) error {
		var wg sync.WaitGroup
		defer wg.Wait()
		trackCtx, stop := context.WithCancel(ctx)
		defer stop()
		// Record which pods this daemon indexes from the endpoints it holds:
		// the daemon that takes one over clears them.
		// At most every second: a pod first seen less than one interval
		// before this daemon dies is not recorded, so keep that short.
		wg.Go(func() {
			to.Track(trackCtx, min(ttl/3, time.Second), lm.Held, d.podsByEndpoint, func(err error) {
				log.Warn("recording the pods of held endpoints failed", "err", err)
			})
		})
		return lm.Run(ctx, func() []string { return addrs },
			func(ctx context.Context, ep string) error {
				if err := to.Prepare(ctx, ep, byAddr[ep].Pod, idx); err != nil {
					return err
				}
				if err := d.sub.AddEndpoint(byAddr[ep]); err != nil {
					return fmt.Errorf("subscribe: %w", err)
				}
				log.Info("lease acquired: previous owner's pods cleared, subscribed", "endpoint", ep)
				return nil
			},
			func(ep string) {
				if err := d.sub.RemoveEndpoint(ep); err != nil {
					log.Warn("lease released: remove endpoint", "endpoint", ep, "err", err)
					return
				}
				log.Info("lease released: unsubscribed and cleared", "endpoint", ep)
			})
	}
	log.Info("leases on", "endpoints", len(addrs), "ttl", ttl)
	return nil
}

// podsByEndpoint maps each endpoint to the pod names of the streams that
// arrived through it.
func (d *daemon) podsByEndpoint() map[string][]string {
	out := map[string][]string{}
	for _, st := range d.sub.Streams() {
		out[st.Endpoint] = append(out[st.Endpoint], st.Pod)
	}
	return out
}
