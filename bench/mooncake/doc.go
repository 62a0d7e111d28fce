// Package mooncake is the Mooncake open-loop replay: the method of Dynamo's
// mooncake_bench, the yardstick the Flash Indexer is measured with, against
// this project's own decoder, applier, index and scorer.
//
// Partition stretches, copies and deals a Mooncake trace to workers; Build
// runs each worker's requests through a mock engine (Engine, an LRU block
// pool with prefix caching) and records the queries and the vLLM KV-event
// messages the engines publish; Replay issues them open-loop at their
// deadlines within a window, and Saturation compresses the window until the
// indexer stops keeping up. hack/mooncakebench is the command;
// docs/performance.md maps every mooncake_bench parameter to ours.
package mooncake
