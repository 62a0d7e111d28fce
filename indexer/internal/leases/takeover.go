package leases

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// PodClearer clears every DP rank of a pod known to the shared index, by
// name (redisindex.Index.ClearPodsNamed): ranks this daemon never saw
// included, since they are read from the index, not from a local interner.
type PodClearer interface {
	ClearPodsNamed(ctx context.Context, name string) error
}

// Takeover makes the daemon that acquires an endpoint start it from a clean
// state. The previous owner may have died without clearing: what it indexed
// from that endpoint may have missed events (those between its death and
// the takeover are lost), so it must not be served.
//
// Which pods is the hard part: an endpoint configured without a pod name
// names its pods by topic, and an engine may publish several DP ranks, none
// of which the taker has necessarily seen. So the owner records, in Redis,
// the pod names it indexed from each endpoint it holds (Record, driven by
// Track every interval), and the taker clears each recorded name, plus the configured one,
// through the shared index (every rank the index knows of) before it
// subscribes.
//
// What remains: a pod name an endpoint starts publishing under less than
// one Track interval before its owner dies is not recorded yet and is not
// cleared; its entries age out by the index TTL.
type Takeover struct {
	client redis.UniversalClient
	ns     string
	// maxNames bounds the names recorded per endpoint: a misbehaving engine
	// inventing topic names must not grow Redis without bound.
	maxNames int64
}

// DefaultMaxNames is the default bound on pod names recorded per endpoint.
const DefaultMaxNames = 1024

// NewTakeover uses client c under the index's namespace.
func NewTakeover(c redis.UniversalClient, namespace string) *Takeover {
	return &Takeover{client: c, ns: namespace, maxNames: DefaultMaxNames}
}

func (t *Takeover) key(ep string) string { return endpointKey(t.ns, "lease-pods", ep) }

// Record adds, for each endpoint of seen, the pod names indexed from it to
// that endpoint's record (one pipelined round trip). Call it with the
// endpoints this daemon holds only. An endpoint already at the bound gets
// nothing more and is reported in the error (the others are recorded).
func (t *Takeover) Record(ctx context.Context, seen map[string][]string) error {
	if len(seen) == 0 {
		return nil
	}
	eps := slices.Sorted(maps.Keys(seen))
	// Read the sizes first (the bound), then add: two round trips, but only
	// when something is new, which after warm-up is never.
	pipe := t.client.Pipeline()
	has := make([]*redis.BoolSliceCmd, len(eps))
	cards := make([]*redis.IntCmd, len(eps))
	uniq := make(map[string][]string, len(eps))
	for i, ep := range eps {
		uniq[ep] = slices.Compact(slices.Sorted(slices.Values(seen[ep])))
		names := make([]any, len(uniq[ep]))
		for j, n := range uniq[ep] {
			names[j] = n
		}
		if len(names) == 0 {
			continue
		}
		has[i] = pipe.SMIsMember(ctx, t.key(ep), names...)
		cards[i] = pipe.SCard(ctx, t.key(ep))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("leases: record pods: %w", err)
	}
	var full []string
	add := t.client.Pipeline()
	for i, ep := range eps {
		if has[i] == nil {
			continue
		}
		var missing []any
		for j, in := range has[i].Val() {
			if !in {
				missing = append(missing, uniq[ep][j])
			}
		}
		if len(missing) == 0 {
			continue
		}
		if room := t.maxNames - cards[i].Val(); room < int64(len(missing)) {
			full = append(full, ep)
			missing = missing[:max(room, 0)]
		}
		if len(missing) > 0 {
			add.SAdd(ctx, t.key(ep), missing...)
		}
	}
	if add.Len() > 0 {
		if _, err := add.Exec(ctx); err != nil {
			return fmt.Errorf("leases: record pods: %w", err)
		}
	}
	if len(full) > 0 {
		return fmt.Errorf("leases: record pods: endpoints %v already have %d names recorded; newer ones are not", full, t.maxNames)
	}
	return nil
}

// Recorded lists the pod names recorded for ep, sorted.
func (t *Takeover) Recorded(ctx context.Context, ep string) ([]string, error) {
	names, err := t.client.SMembers(ctx, t.key(ep)).Result()
	if err != nil {
		return nil, fmt.Errorf("leases: recorded pods of %s: %w", ep, err)
	}
	slices.Sort(names)
	return names, nil
}

// Prepare runs before the daemon subscribes ep after acquiring its lease:
// it clears every pod recorded for ep and the configured pod name (""
// when the endpoint names its pods by topic), every DP rank of each, then
// forgets the record (the new owner records what it indexes from now on).
// On error nothing is forgotten and the caller must not subscribe.
func (t *Takeover) Prepare(ctx context.Context, ep, configuredPod string, idx PodClearer) error {
	names, err := t.Recorded(ctx, ep)
	if err != nil {
		return err
	}
	if configuredPod != "" && !slices.Contains(names, configuredPod) {
		names = append(names, configuredPod)
	}
	for _, name := range names {
		if err := idx.ClearPodsNamed(ctx, name); err != nil {
			return fmt.Errorf("leases: clear pod %q of %s: %w", name, ep, err)
		}
	}
	// Only the names read above: one recorded since by a previous owner
	// still running (about to notice it lost the lease) stays for the
	// next takeover rather than being dropped uncleared.
	if len(names) > 0 {
		args := make([]any, len(names))
		for i, n := range names {
			args[i] = n
		}
		if err := t.client.SRem(ctx, t.key(ep), args...).Err(); err != nil {
			return fmt.Errorf("leases: forget pods of %s: %w", ep, err)
		}
	}
	return nil
}

// Track calls Record every interval with the pod names seen (by the
// subscriber) on the endpoints this daemon holds, until ctx is done.
// seen returns endpoint -> pod names for every stream; held lists the
// endpoints this daemon holds (Manager.Held). Errors are passed to
// report and retried at the next interval.
func (t *Takeover) Track(ctx context.Context, every time.Duration, held func() []string, seen func() map[string][]string, report func(error)) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		all := seen()
		mine := map[string][]string{}
		for _, ep := range held() {
			if names := all[ep]; len(names) > 0 {
				mine[ep] = names
			}
		}
		if err := t.Record(ctx, mine); err != nil && ctx.Err() == nil {
			report(err)
		}
	}
}
