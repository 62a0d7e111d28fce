package indexer

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvindex/kvindex/indexer/persist"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
)

// startEvents builds the subscriber and its features (persistence, leases)
// when Config.Events is set. A feature whose backend or configuration
// cannot support it is an error.
func (ix *Indexer) startEvents(cfg Config) error {
	if cfg.Events == nil {
		if cfg.Persist.Path != "" || len(cfg.Peers.URLs) > 0 || cfg.Leases.Enabled {
			return errors.New("indexer: persistence, peers and leases need an event subscriber (Config.Events)")
		}
		return nil
	}
	subCfg := *cfg.Events
	if cfg.Leases.Enabled {
		// With leases the endpoint list is divided between daemons; the lease
		// loop adds and removes the endpoints this daemon owns at runtime.
		var err error
		if ix.leases, err = ix.newLeaseLoop(cfg.Leases, subCfg.Endpoints); err != nil {
			return err
		}
		subCfg.Endpoints = nil
	}
	var restored *persist.Loaded
	if cfg.Persist.Path != "" {
		var err error
		// a snapshot is held to the limits its events were
		lim := persist.Limits{MaxPods: subCfg.MaxStreams, MaxModels: subCfg.MaxModels, MaxDPRanks: subCfg.MaxDPRanks}
		if ix.persist, err = ix.newPersistence(cfg.Persist, lim, cfg.Registry); err != nil {
			return err
		}
		// Loaded before the subscriber exists: no batch can reach the
		// index before the snapshot's entries are in it.
		restored = ix.persist.load()
	}
	if restored == nil && len(cfg.Peers.URLs) > 0 {
		// Same place and same contract as the file: loaded into the fresh
		// index before the subscriber exists, then resumed at the copy's
		// sequence numbers.
		lim := persist.Limits{MaxPods: subCfg.MaxStreams, MaxModels: subCfg.MaxModels, MaxDPRanks: subCfg.MaxDPRanks}
		var err error
		if restored, err = ix.recoverFromPeers(cfg.Peers, lim, cfg.Registry); err != nil {
			return err
		}
	}
	// A storage claim no configured source names is refused before its
	// stream is admitted, so it holds no --max-streams slot (the sink
	// refuses it too, for batches that reach it another way).
	if own := subCfg.Refuse; own != nil {
		subCfg.Refuse = func(b *event.Batch) bool { return ix.refuseStorageClaim(b) || own(b) }
	} else {
		subCfg.Refuse = ix.refuseStorageClaim
	}
	var err error
	ix.sub, err = kvevents.NewSubscriber(subCfg, ix.Sink(), kvevents.NewMetrics(cfg.Registry), ix.log)
	if err != nil {
		return err
	}
	ix.streams = ix.sub
	if restored != nil {
		ix.resumeRestored(restored)
	}
	return nil
}

// Subscriber is the event subscriber (nil without Config.Events): the API
// lists its streams and adds endpoints through it, discovery feeds it.
func (ix *Indexer) Subscriber() *kvevents.Subscriber { return ix.sub }

// Run runs the background work until ctx is done: the event subscriber,
// the lease loop and periodic snapshots (the subscriber also recovers pods
// an index error left unservable: kvevents/trust.go). On shutdown it orders them: leases are released
// first (their endpoints removed and their pods' clears queued on the
// still-running subscriber), then the subscriber drains and stops, then the
// final snapshot is written from the stopped event path. Close afterwards.
func (ix *Indexer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	fail := func(what string, err error) {
		if err != nil && ctx.Err() == nil {
			errc <- fmt.Errorf("%s: %w", what, err)
		}
	}
	// The subscriber and the lease loop get their own contexts so that
	// shutdown can order them.
	subCtx, subCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer subCancel()
	subDone := make(chan struct{})
	if ix.sub != nil {
		go func() { defer close(subDone); fail("kvevents", ix.sub.Run(subCtx)) }()
	} else {
		close(subDone)
	}
	leaseCtx, leaseCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer leaseCancel()
	leasesDone := make(chan struct{})
	if ix.leases != nil {
		go func() { defer close(leasesDone); fail("leases", ix.leases.run(leaseCtx)) }()
	} else {
		close(leasesDone)
	}
	if ix.persist != nil {
		wg.Go(func() { ix.persist.saver.Run(ctx) })
	}

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	leaseCancel()
	<-leasesDone
	subCancel()
	<-subDone
	wg.Wait()
	if ix.persist != nil {
		// The event path has stopped: this is the newest state.
		_ = ix.persist.saver.Save()
	}
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	return err
}
