// Package indexer is the composition root of the KV-cache index: the one
// place that builds and wires the interner, the block hashers, the index
// backend, the event applier and the scorer, and the one API the rest of the
// program uses to reach them.
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
//     ranks folded into one entry each.
//
// Score is transport-neutral: failures are *Error values with a Code that
// api maps to gRPC codes and HTTP statuses. Pods whose index entries the
// applier no longer trusts (an index write failed and the pod has not been
// cleared since) are an explicit candidate filter of every score.
//
// The Query/Result shape leaves room for more input kinds (a chat "messages"
// input is one more InputKind with its own field) and for a later Pick method
// that chooses one pod from the same Result rather than listing them all.
package indexer
