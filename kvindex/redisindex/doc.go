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
//	<ns>:b:<model>:<key as 16 hex digits>   STRING, one per (model, block key)
//	    one record per holder: 2-byte length L, L bytes of field
//	    "<tier>.0.<dp rank>.<pod name>" (the 0 is fixed), 8-byte pod epoch
//	    (big endian)
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
// The records are packed into one string (rather than one hash field per
// holder, the previous layout) so that reading a block is a plain GET: a
// warm 512-key lookup is one MGET instead of 512 HGETALLs, which cost Redis
// ~1.3 µs each for 8 holders and the client two allocations per field.
// The write scripts edit the string (Lua's struct library); a key of any
// other type (a HASH left by the previous layout) reads as absent and is
// overwritten by the next add, so an upgrade needs no migration (the old
// keys age out by their TTL; the pods-hash counters keep counting them
// until then).
//
// # Cost
//
// Lookup of N keys costs ONE round trip per Redis node. Single node: one
// pipeline of an MGET of the N keys plus one HGET of "_v"; the MGET reply is
// read as raw RESP into a pooled buffer and split in place, so the walk
// allocates nothing per key. Cluster: MGET may not span slots and block keys
// are spread over all of them (model names are escaped so they never form a
// hash tag), so the pipeline has one GET per key; go-redis' ClusterClient
// splits it by node and sends the parts in parallel (verified with a
// per-node round-trip hook: 3 round trips for 3 masters, 1 on a single
// node). Putting a model's blocks in one slot (a hash tag per model) would
// allow one MGET per lookup on Cluster too, but would put all of a model's
// blocks, and all of its read and write load, on one master: with few
// models that defeats the point of a cluster, so it is not done. The walk
// over the values stops at the first key without a live holder (or when the
// scorer's visitor says no candidate is left); stale entries seen in any
// value, even past the miss, are queued for a background compare-and-delete.
//
// Reading past the first miss is cheap and kept on purpose: block keys are
// chained hashes, so past the first block no pod holds, later blocks are
// almost never held; each costs ~(len(ns)+len(model)+20) request bytes and
// a 5-byte null reply. Fetching in growing chunks would add a sequential
// round trip per chunk for exactly the prompts that matter (long warm
// prefixes). The alternative that really stops reading, a Lua script that
// walks the keys on the server (Config.ServerWalk, single node only: a
// Cluster script may only touch one slot), costs more than the MGET in
// both cases now (Lua turns every value into strings and tables) and blocks
// Redis for the whole walk; it is kept as an option, off by default.
//
// Add/Remove of N keys: the block scripts (a single script run over all N
// keys on a single node; one script run per key on Cluster, pipelined per
// node) and, in a second pipeline, the pod counter. Each per-key update is
// atomic (Lua), so concurrent writers from several daemons cannot corrupt
// an entry: at worst the later of two racing writes wins, and a write under
// an older epoch never overwrites a newer one.
//
// Writes are coalesced (writer.go): an Add/Remove issued while another
// flush is on the wire waits and goes out with every other write queued
// meanwhile, in one pipeline of block scripts and one of counters, however
// many pods they come from (up to 64 writes or 16384 keys per flush). A
// lone write is flushed at once, so coalescing adds no latency; under load
// the round trips follow the flushes, not the writes (BenchmarkApply: 4.5-5
// writes per flush with 8 writers). Every caller still waits for its own
// write and gets its own error, and one caller's writes are flushed in
// order, so a pod's event stream (applied by one goroutine) keeps its order.
// An Add/Remove of more than maxWriteKeys (4096) keys is sent as
// consecutive writes of at most that many (one call deadline for all), so
// one pod's huge event does not hold the shared flush.
//
// Memory: an entry is one record, len(pod name)+16 bytes or so (field,
// length and epoch); each block key adds Redis' per-key overhead (dict
// entry, robj, expire entry, key name).
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
//
// Every operation (lookup, write flush, clear, pod counts, health check,
// background refresh and cleanup) runs under a deadline of
// Config.CallTimeout (1s, URL option call_timeout) covering all its round
// trips and go-redis retries, and the client's network deadlines follow it
// (ContextTimeoutEnabled), so a node that hangs with its connections open
// fails the call instead of answering late.
//
// A node that stops answering (guard.go): the first calls to it fail at
// the deadline; one that waited at least half of it marks the node hung,
// and from then on every command to that node fails at once (NodeHungError,
// wrapped in ErrUnavailable) until a probe's PING is answered. Writes share
// one flush in flight (writer.go), so a hung node holds every pod's writes
// for one CallTimeout, once; after that a flush's commands for the other
// nodes are applied at their speed and only the requests with a key on the
// hung node fail (their pods become untrusted in the applier). A lookup
// fails when one of its block keys lives on the hung node. The pods hash
// (<ns>:pods) is read by every lookup, flush and clear: when its node hangs,
// every write, lookup and clear fails (at once after the first) and Healthy
// fails, so the daemon is not ready and every pod that writes becomes
// untrusted.
//
// Cluster failover: go-redis reloads its slot map only on MOVED/ASK, which
// a hung node never sends, so it would keep sending the hung master's slots
// to it after the cluster promoted its replica, until it resumed. Every call
// the guard fails, and every network error, asks for a reload (at most every
// 250 ms), and a reload skips the hung node (its CLUSTER SLOTS fails at
// once): writes and lookups reach the new master within a reload of the
// promotion, and Healthy (ForEachMaster, which reloads the map first) is not
// failed by the hung node once it is no longer a master.
//
// A Redis that lost entries without an error (restart, eviction, flush) is
// detected by loss.go every Config.LossCheck (1s, URL option loss_check)
// and reported through OnLost.
package redisindex
