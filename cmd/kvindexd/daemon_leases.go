package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvindex/redisindex"
)

// setupLeases prepares the connect-topology lease loop (--leases): the
// configured endpoint list is shared by every daemon on one Redis index, and
// each endpoint is subscribed by exactly one live daemon, through a lease in
// Redis. Acquiring a lease subscribes the endpoint; releasing it (rebalance,
// Redis lost, shutdown) unsubscribes and clears that endpoint's pods, so the
// daemon that takes over starts from a clean, trusted state.
func (d *daemon) setupLeases(eps []kvevents.EndpointConfig) error {
	idx, ok := d.index.(*redisindex.Index)
	if !ok {
		return errors.New("--leases needs a shared index: --index redis://... or redis-cluster://...")
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
	lm := redisindex.NewLeaseManager(idx.Client(), idx.Namespace(), id, ttl)
	lm.SetLogger(d.log.With("component", "leases", "daemon_id", id))
	d.leases = func(ctx context.Context) error {
		return lm.Run(ctx, func() []string { return addrs },
			func(ep string) {
				// The previous owner may have died without clearing: what it
				// wrote for this endpoint's pod can be stale (events between
				// its death and now are lost), so start that pod from empty.
				if name := byAddr[ep].Pod; name != "" {
					ids := d.interner.PodsNamed(name)
					if len(ids) == 0 {
						ids = append(ids, d.interner.Pod(name, 0))
					}
					for _, id := range ids {
						if err := d.index.ClearPod(ctx, id); err != nil {
							d.log.Warn("lease acquired: clearing the previous owner's state failed", "endpoint", ep, "err", err)
						}
					}
				}
				if err := d.sub.AddEndpoint(byAddr[ep]); err != nil {
					d.log.Warn("lease acquired but endpoint not added", "endpoint", ep, "err", err)
					return
				}
				d.log.Info("lease acquired: subscribed", "endpoint", ep)
			},
			func(ep string) {
				if err := d.sub.RemoveEndpoint(ep); err != nil {
					d.log.Warn("lease released: remove endpoint", "endpoint", ep, "err", err)
					return
				}
				d.log.Info("lease released: unsubscribed and cleared", "endpoint", ep)
			})
	}
	d.log.Info("leases on", "daemon_id", id, "endpoints", len(addrs), "ttl", ttl)
	return nil
}
