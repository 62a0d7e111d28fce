// Package kvevents subscribes to the KV-cache events of vLLM and SGLang
// engines over ZeroMQ, decodes them into engine-neutral kvindex.Batch values
// and hands them to a kvindex.BatchSink, in order per (pod, data-parallel
// rank).
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
// Every message is [topic, seq (8 bytes, big-endian), msgpack payload];
// anything else is dropped and counted. Topic kv@<pod>@<model> names the pod
// and model; an endpoint's Pod/Model override it. The payload decoder
// (Decode) accepts vLLM's array and map event forms and SGLang's, hashes of
// any integer width and sign or as byte digests, and drops only the event
// that is malformed.
//
// # Sequence numbers
//
// seq counts from 0 per engine process. A forward jump is counted (gaps,
// missed batches) and, with a replay endpoint, repaired by fetching the
// missed batches before applying the live one. A backward jump means the
// engine restarted: a synthetic AllBlocksCleared is delivered before its
// batch. See Subscriber for the other synthetic clears.
package kvevents
