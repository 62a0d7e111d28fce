// Package promises holds the promises suite: one test per limit that
// docs/security.md states and per guarantee that docs/promises.md states,
// each run against the real kvindexd binary started with its default flags
// plus only the flag the promise names, driven over the network (ZMQ in;
// HTTP, gRPC and /metrics out). Both documents name the test of every row,
// and TestEveryPromiseHasATest keeps the tables and the tests from drifting
// apart. The package has no code of its own besides this comment.
//
// A promise test judges what the daemon did (its answers, counters and
// states), never a wall-clock budget: the race pass of `make test` runs it
// race-built, in parallel, on two cores. Every wait is a hang guard
// (internal/testkit/wait), and a test whose daemon does heavy work (loads a
// tokenizer, moves hundreds of MiB, floods a worker) takes harness.Heavy
// after t.Parallel, so no two of them share the machine.
package promises
