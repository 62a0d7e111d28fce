// Package promises holds the promises suite: one test per limit that
// docs/security.md states and per guarantee that docs/promises.md states,
// each run against the real kvindexd binary started with its default flags
// plus only the flag the promise names, driven over the network (ZMQ in;
// HTTP, gRPC and /metrics out). Both documents name the test of every row,
// and TestEveryPromiseHasATest keeps the tables and the tests from drifting
// apart. The package has no code of its own besides this comment.
package promises
