// Package grpcbuf is the buffer pool and proto codec the daemon's gRPC
// server and the Go client hand to grpc-go in place of its defaults.
//
// grpc-go takes every message buffer from a pool of a few tiers (256 B, 4,
// 16, 32 KiB, 1 MiB) and zeroes the whole buffer it hands out. A message
// just above 32 KiB (8,192 packed token ids) gets a 1 MiB buffer, and
// zeroing it costs ~20 us on each side of the call: more than the index
// lookup. Tiers at every power of two up to 4 MiB keep a buffer within 2x
// of the message, so the zeroing (kept: a reused buffer never shows an
// earlier request's bytes) costs what the message's own copy does.
package grpcbuf

import "google.golang.org/grpc/mem"

// Pool has a tier at every power of two from 256 B to 4 MiB; larger
// messages are allocated as grpc-go allocates them.
var Pool mem.BufferPool

func init() {
	var exps []uint8
	for e := uint8(8); e <= 22; e++ {
		exps = append(exps, e)
	}
	p, err := mem.NewBinaryTieredBufferPool(exps...)
	if err != nil {
		panic(err)
	}
	Pool = p
}
