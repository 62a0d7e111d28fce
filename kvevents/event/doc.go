// Package event is the engine-neutral vocabulary of KV-cache events: a Batch
// of Events from one engine, their kinds (BlockStored, BlockRemoved,
// AllBlocksCleared, and the BlockSnapshot kvevents builds from a snapshot
// reply), attention group kinds, the storage tier a medium string names, and
// Sink, the contract of whatever consumes batches.
//
// kvevents decodes every engine's wire format into this vocabulary; the
// applier consumes it. It is a leaf of its own so that both can depend on it
// without depending on each other: kvevents builds without the index or the
// applier, and the applier without ZeroMQ.
package event
