// Package indexer is the composition root of the KV-cache index: the one
// place that builds and wires the interner, the block hashers, the index
// backend, the event applier and the scorer, and the one API the rest of the
// program uses to reach them.
//
// # Embedding
//
// It is also what a Go router imports to run the index in its own process,
// as kvindexd does, with no daemon and no network hop per request:
//
//   - New(ctx, Config) builds it: Config.Keys must be the engines' block
//     keys (hash algorithm, block size, PYTHONHASHSEED), Config.Events
//     subscribes to the engines' KV events (bind for the central topology,
//     Endpoints for engines that bind), Config.Tokenizer and Config.Chat
//     are needed only for prompt and chat inputs;
//   - Run(ctx) runs the subscriber (and snapshots, leases) until ctx ends;
//   - Score(ctx, *Query, *Result) and Pick(ctx, *PickQuery, *PickResult)
//     answer from any goroutine, into a Result the caller reuses (no
//     allocation per block once its buffers have grown);
//   - Close, after Run has returned, releases the sockets and the backend.
//
// The answers are the daemon's: kvindexd is this package behind gRPC and
// HTTP (internal/promises checks both give the same Score and Pick on the
// same events). See Example for the whole cycle.
//
// Every part that maps names to ids must share one kvindex.Interner, or ids
// written by the applier would mean other pods to the scorer or the Redis
// backend. Config therefore takes the backend as a factory that receives the
// interner New created; no caller ever holds an interner of its own.
//
// Two consumers sit on top:
//   - kvevents delivers decoded engine batches to Sink (the applier);
//   - transports (package api, the simulator) ask Score with a name-level
//     Query and read a name-level Result: pods by name, their data-parallel
//     ranks folded into one entry each; or Pick with a PickQuery (the same
//     request plus the router's candidates and their load).
//
// Score is transport-neutral: failures are *Error values with a Code that
// api maps to gRPC codes and HTTP statuses. Whether a pod's entries may be
// served is an explicit candidate filter of every score and pick, and it is
// not decided here: the subscriber owns a pod's trust (kvevents: an index
// write failed and the pod is not cleared yet, or a pod restored from a
// snapshot whose stream has not resumed), the indexer asks it
// (Subscriber.StreamStates, and Servable for one pod) and relays only what
// the subscriber cannot see, a backend that lost entries. Without
// Config.Events every pod is served: whoever calls Sink's Apply owns the
// outcome it returns.
//
// Inputs are token ids, block hashes, a /v1/completions prompt (through
// Config.Tokenizer) or a chat request (through Config.Chat, which renders it
// with the model's chat template); Query.SetOpenAIRequest reads a router's
// OpenAI body into one of them.
//
// With Config.Prediction on, a sample of scored requests is remembered and
// checked against the blocks the engines later store (predict.go): a
// rendering or hashing difference from the engines shows as a miss rate
// near 100%.
//
// Pick answers "where should this request go" on the same path: the same
// inputs and keys as Score, one index lookup over the router's candidates,
// then a policy of package routing weighs each candidate's cached prefix
// against its load. Two stores beside the index cover what events cannot
// tell yet: speculative entries (the pod a Pick chose is assumed to hold the
// request's blocks for a short TTL, until its BlockStored arrives; shared
// through Redis when the index is; speculation*.go) and a routing history
// for candidates that publish no events. Both are bounded, counted and on
// an injectable clock.
package indexer
