// Package redisindex is the Redis (and Redis Cluster) backend of
// kvindex.Index, so several kvindexd daemons can share one index. (The
// leases that divide engine endpoints between those daemons live in package
// leases, under the same namespace.)
//
// # Key schema
//
// Every key starts with the namespace (Config.Namespace, default "kvindex"),
// so deployments can share a Redis; nothing ever SCANs, FLUSHes or touches a
// key outside it.
//
//	<ns>:b:<model>:<key as 16 hex digits>   HASH, one per (model, block key)
//	    field "<tier>.<group>.<dp rank>.<pod name>"  value "<pod epoch>"
//	    PEXPIRE = TTL, refreshed by every add (safety net for lost removals)
//	<ns>:pods                                HASH, one per namespace
//	    "e:<dp rank>.<pod name>"  current epoch of the pod
//	    "n:<dp rank>.<pod name>"  distinct blocks the pod holds (PodBlocks)
//	    "m:<dp rank>.<pod name>"  live entries of the pod (sum = Stats.Entries)
//	    "_v"                      changes on every clear (epoch-cache version)
//	    "_k", "_c"                block-key count (Stats.Keys), clear counter
//	<ns>:lease:..., <ns>:lease-pods:..., <ns>:daemons   package leases
//
// Pods and models are stored by name; a reader interns them into its own
// PodID/ModelID through the shared kvindex.Interner. Model names have '{',
// '}' and '%' %-escaped so they can never form a Cluster hash tag: block keys
// spread over all slots.
//
// # Epochs: O(1) clear, lazy cleanup
//
// An entry is live iff its value (the epoch it was written under) is >= its
// pod's current epoch. ClearPod is one script on the pods hash that moves
// the pod to a new epoch (max(old+1, server time in µs), so even a Redis
// that lost its data never reissues an old epoch) and resets its counter:
// every entry of the pod becomes invisible at once, whatever the number of
// blocks. Readers that meet a stale entry queue a compare-and-delete (delete
// the field only if it still holds the stale value, so a concurrent re-add
// survives) and count it in Stats().Expired; the TTL removes whatever nobody
// reads again.
//
// Writers and Cluster readers cache the epochs: they read "_v" in the same
// pipeline as their block commands and, when it changed (a clear, by any
// daemon), re-read the pods hash: one extra round trip after a clear, none
// otherwise. A writer whose cached epoch was behind (another daemon cleared
// the pod) notices it in the same round trip and rewrites under the current
// epoch; an entry is never downgraded to an older epoch.
//
// # Cost
//
// Lookup of N keys costs ONE round trip per Redis node: a pipeline of N
// HGETALL plus one HGET of "_v". On Cluster, go-redis' ClusterClient splits
// it by node and sends the parts in parallel (verified with a per-node
// round-trip hook: 3 round trips for 3 masters, 1 on a single node). The
// walk over the replies stops at the first key without a live holder (or
// when the scorer's visitor says no candidate is left); stale entries seen
// in any reply, even past the miss, are queued for a background
// compare-and-delete.
//
// Reading past the first miss is cheap and kept on purpose: block keys are
// chained hashes, so past the first block no pod holds, later blocks are
// almost never held; each costs ~(len(ns)+len(model)+30) request bytes and
// a 3-byte empty reply. Fetching in growing chunks would add a sequential
// round trip per chunk for exactly the prompts that matter (long warm
// prefixes). The alternative that really stops reading, a Lua script that
// walks the keys on the server (Config.ServerWalk, single node only: a
// Cluster script may only touch one slot), was measured on a 512-key,
// 8-pod prompt: ~25% faster when most of the prompt is new, about 2x slower
// when the whole prompt is warm (Lua converts every hash into tables), and it
// blocks Redis for the whole walk. So it is an option, off by default.
//
// Add/Remove of N keys: one pipelined round trip for the entries (a single
// script run over all N keys on a single node; one script run per key on
// Cluster, pipelined per node) and one for the pod counter. Each per-key
// update is atomic (Lua), so concurrent writers from several daemons cannot
// corrupt an entry: at worst the later of two racing writes wins, and a
// write under an older epoch never overwrites a newer one.
//
// Memory: an entry is one field of a small hash (listpack encoding), about
// len(pod name)+10 bytes of field and up to 16 bytes of value; each block key
// adds Redis' per-key overhead (dict entry, robj, expire entry, key name).
// BenchmarkBytesPerEntry measures it with INFO memory (used_memory) before
// and after 1M entries.
//
// Stats: Entries and Keys come from counters in the pods hash, refreshed in
// the background (Config.StatsRefresh); Expired counts stale entries this
// process found and deleted plus the block keys Redis expired by their TTL
// (next section). The pods-hash counters (Entries, Keys, PodBlocks) are not
// decreased by TTL expirations: the expired key's fields are gone by the
// time the event arrives.
//
// # TTL expirations
//
// A block key whose TTL fires is counted through Redis keyspace
// notifications: a background watcher PSUBSCRIBEs to
// __keyevent@<db>__:expired and counts every expired key of the form
// <ns>:b:<model>:<16 hex> (foreign keys, other namespaces and our other
// keys are ignored) into TTLExpirations, which Stats().Expired includes.
// Keyspace events are local to the node that expires the key, so on Cluster
// there is one subscription per master (the masters are re-listed every few
// seconds, so a failover or a late slot table is picked up). Every
// (re)connection first reads CONFIG GET notify-keyspace-events, so a
// restarted Redis is re-checked. The index never changes the server's
// configuration:
//
//   - notifications off (the Redis default, notify-keyspace-events ""), or
//     without both E and x (A includes x): one warning is logged
//     (Config.Logger) naming the setting to enable, notify-keyspace-events
//     Ex (or E and x added to the current flags); nothing is subscribed and
//     TTL expirations stay uncounted. The setting is re-checked every 30s,
//     so enabling it at runtime starts the counting without a restart.
//   - CONFIG refused (managed Redis, ACL, renamed command): one info line,
//     and the watcher subscribes anyway; it counts if the provider enabled
//     the notifications (e.g. a parameter group with "Ex").
//
// Notes: each daemon sharing a namespace sees (and counts) every expiration,
// so do not sum TTLExpirations across daemons; the count is of block keys
// (a key may hold several pods' entries), while the lazy-cleanup part of
// Expired counts entries; with notifications on, Redis publishes every
// expired key of the database to each subscriber, including other
// applications' keys, which costs a little bandwidth per expiration and per
// daemon. Redis pub/sub is fire-and-forget: expirations that happen while a
// watcher is reconnecting are not counted. With TTL disabled (Config.TTL < 0)
// no watcher runs. Close stops the watchers and waits for them.
//
// # Failure behaviour
//
// New never fails because Redis is down; Healthy pings and reports it; every
// operation returns an error wrapping ErrUnavailable while Redis is away
// (lookups never return a silently empty or shortened result); go-redis
// reconnects by itself. Scripts are reloaded transparently after a Redis
// restart (NOSCRIPT). The Applier marks pods whose writes failed untrusted
// and clears them (new epoch) before trusting new events again.
package redisindex
