// Package applier applies decoded event batches to an index. It owns what a
// stream's events mean for the index: the live parity check (recomputing each
// stored block's key and comparing it with the engine's hash), the keys a pod's
// blocks are indexed under when its hashes are not ours (aliases), the copy
// counts and attention-group holds that decide when a block is really gone,
// each pod's share of the index, and the sessions BlockStored names.
//
// It consumes package event's batches and writes through the kvindex.Index
// contract. It knows nothing of sockets, sequence numbers or replay (package
// kvevents), nor of scores (package kvindex). It reports each batch's outcome
// to its caller; it does not decide whether a pod's answers can be served.
package applier
