// Package kvevents subscribes to the KV-cache events of vLLM and SGLang
// engines over ZeroMQ, decodes them into engine-neutral event.Batch values
// and hands them to a event.Sink, in order per (pod, data-parallel
// rank). It is the one owner of a pod's trust (below).
//
// # Topologies
//
// Central: the Subscriber's SUB socket binds Config.Bind (the daemon uses
// DefaultBind, "tcp://*:5557") and every engine connects to it:
//
//	--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq",
//	  "endpoint":"tcp://kvindexd:5557","topic":"kv@<pod>@<model>"}'
//
// Per pod: each engine binds and the Subscriber connects to every endpoint in
// Config.Endpoints (or added at runtime with AddEndpoint):
//
//	--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq",
//	  "endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv@<pod>@<model>"}'
//
// vLLM binds only when its endpoint contains '*' or '::' (or is ipc:// or
// inproc://): "tcp://0.0.0.0:5557" makes it connect.
//
// # Messages
//
// Messages arrive through package zmtp (ZMTP 3.x over TCP or IPC). Every
// message is [topic, seq (8 bytes, big-endian), msgpack payload];
// anything else is dropped and counted. Topic kv@<pod>@<model> names the pod
// and model; an endpoint's Pod/Model override it. The payload decoder
// (Decode) accepts vLLM's array and map event forms and SGLang's, hashes of
// any integer width and sign or as byte digests, and drops only the event
// that is malformed.
//
// # Wire formats by engine version
//
// Which fields each engine version sends and what the daemon does with them:
// docs/wire-formats.md (fixtures of each shape: testdata/fixtures).
//
// An optional field whose value cannot be interpreted never drops a block:
// it is skipped and counted (ignored_fields_total), and when it is an input
// of the block hash (extra_keys, lora_name) the block is indexed under the
// engine's hash. Only the event's structure, tag, block_hashes and
// parent_block_hash are required.
//
// An SGLang snapshot is the cache's state at its barrier: kvindex replaces
// what the index holds for the pod with it (event.BlockSnapshot), which
// repairs lost removals. Its records carry SGLang hashes without token ids:
// a block whose BlockStored was seen is indexed under its key (the hash ->
// key alias), the others under the engine's hash, which is how that pod's
// unverified blocks are keyed anyway. The records name no medium: they
// are indexed as GPU. Catching up through the replay buffer (below) carries
// token ids and is tried first. A large snapshot is applied in turns of its
// worker (dispatcher_workqueue.go), the pod incomplete
// ("snapshot_applying") until the last.
//
// # Sequence numbers
//
// seq counts from 0 per engine process. A forward jump is counted (gaps,
// missed batches) and, with a replay endpoint, repaired by fetching the
// missed batches before applying the live one. A backward jump to a low
// value (below 16, or below half the last one) or a new SGLang epoch means
// the engine restarted: a synthetic AllBlocksCleared is
// delivered before its batch, and with a replay endpoint the new lifetime's
// first batches are fetched after it. See Subscriber for the other synthetic
// clears.
//
// Catching up: each time an endpoint with a replay address connects or
// reconnects, the subscriber asks for every batch the engine buffered after
// the last one it holds (all of them the first time) before reading live
// messages, so a daemon started after the engine serves it at once; live
// copies of those batches are dropped. A stream first seen after seq 0 is
// replayed from 0 the same way. StreamStats.Complete says whether the index
// holds every batch since the engine's cache was last empty;
// CompleteSinceSeq and IncompleteReason say how far back it does and why
// not (a gap older than the replay buffer: "replay_window").
//
// A stream whose index entries the backend lost (MarkIndexLost) and whose
// endpoint has a replay address but no snapshot address is rebuilt from the
// replay buffer from seq 0 (rebuild.go): complete again only if the buffer
// still holds the lifetime's start.
//
// An equal sequence number (a duplicate) or a backward jump that stays high
// (a batch from the past) is dropped and counted, never a clear.
//
// # A pod's trust
//
// This package alone answers, for every (pod, dp rank), whether the index's
// entries for it may be served (StreamState.Held, Servable) and whether they
// are complete, and why not (StreamStats.Complete, IncompleteReason); the
// read path (scores, picks, pod listings) asks here and nowhere else. The
// sequence decision sets completeness; the sink reports what each batch did
// to the index (event.ApplyOutcome), recorded on the pod's worker right
// after Apply: a failed write holds the pod and makes its stream incomplete
// ("index_error"), a batch that went through serves it again, and a pod that
// stays quiet gets the clear that recovers it from the subscriber itself. A
// pod restored from a saved index (ResumeFrom) is held until a batch of its
// stream has been applied, and the sequence decision of that batch alone
// says whether it is cleared first. The sink decides nothing and never calls
// back; the composition root reports what only it sees, a backend that lost
// entries (MarkIndexLost). See trust.go.
//
// # Limits
//
// What a publisher can make the subscriber hold is bounded (limits.go):
// streams, model names, DP ranks, name length and form (valid UTF-8, no
// control characters: names become metric labels and JSON), array elements
// per payload, the memory of queued batches, and warnings per source (rate
// limited, with a count of what was suppressed). A stream silent for
// PodExpiry is cleared and forgotten. The ZMQ transport (package zmtp)
// bounds message size, handshakes and connections.
//
// # Files
//
// One role per file, so a change to one concern stays in one place:
//
//	subscriber.go  Subscriber, Config, NewSubscriber, Run/Close and the shutdown order
//	options.go     Config's tunables: their defaults, ranges and help (Options),
//	               DefaultConfig, ValidateConfig, the one reading of a zero field
//	endpoint.go    the sockets: bind socket, connect endpoints (Add/RemoveEndpoint),
//	               reconnect with backoff, the receive loop
//	message.go     one message -> one batch: frame checks, topic, decode counters
//	stream.go      per-(pod, dp rank) streams: StreamStats, completeness, synthetic clears
//	sequence.go    what a batch's sequence number means for its stream (decideSeq,
//	               a pure function with a table test)
//	replay.go      the replay exchange with an engine's ROUTER: after a gap,
//	               and catching up at connect
//	snapshot.go    SGLang's snapshot-v1 exchange and the resync it drives
//	trust.go       a pod's trust: the sink's outcome recorded, the hold on
//	               serving (Servable), the recovery of a quiet pod after a
//	               failed write
//	resume.go      streams resumed from a saved index (ResumeFrom)
//	lost.go        streams whose connection ended in the middle of a message
//	indexlost.go   streams whose index entries were lost: by the backend
//	               (MarkIndexLost) or by a failed write (the sink's outcome)
//	rebuild.go     rebuilding such a stream from its engine's replay buffer
//	limits.go      the caps on streams, models, ranks and names, pod expiry,
//	               rate-limited warnings
//	dispatcher*.go the ordered per-stream workers, one file per role:
//	  dispatcher.go              the workers, their pinning of streams, drain
//	                             at shutdown
//	  dispatcher_enqueue.go      queueing a batch or a forget order
//	  dispatcher_backpressure.go a reader's bounded wait on a full queue
//	  dispatcher_budget.go       the byte budget of all queues together
//	  dispatcher_workqueue.go    a worker's queue: its streams in turn
//	                             (deficit round robin by bytes)
//	  dispatcher_share.go        each stream's share of its worker
//	  dispatcher_stall.go        how long the apply path has been stuck
//	                             (readiness)
//	decode.go, event.go, event_hashes.go, event_extrakeys.go, msgpack.go
//	               the payload decoder (the engines' array/map forms)
//	metrics.go     the Prometheus series
//
// Locks: the Subscriber's mu guards its maps and is never held across I/O.
// Each stream has two: order, held by the socket reader from the sequence
// check to the queue (and across a replay exchange, which is what keeps
// replayed batches ahead of the live one), and mu, held only to copy or bump
// its statistics. Streams and Endpoints take only the short locks, so
// listings and metric scrapes never wait on the network.
//
// # Shutdown
//
// Run stops the sockets first (a replay in progress is abandoned), then the
// workers apply what is still queued for at most Config.DrainTimeout, with a
// context that ends when that bound expires; what is left is dropped and
// counted (kvindexd_kvevents_shutdown_dropped_batches_total).
//
// The engine side of the wire (a pure-Go publisher and msgpack encoders used
// by tests, the demo and the load generator) lives in internal/testkit/enginepub: the
// daemon only decodes.
package kvevents
