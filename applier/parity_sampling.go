package applier

import (
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// Parity sampling: re-hashing every stored block costs one SHA-256 per block,
// which caps the write path at a few million blocks/s per core. A pod's
// configuration (seed, algorithm, block size) cannot change while it runs, so
// once it has been proven the check only needs to keep watching, not to
// re-prove every block:
//
//   - full: every BlockStored with token ids is verified (as before), until
//     ParityProofBlocks consecutive blocks have matched;
//   - sampled: then one BlockStored event in ParitySampleEvery is verified:
//     the first verifiable one (no parent, or a parent whose digest we know)
//     once that many events have passed since the last verified one. The
//     others are indexed under the engine's hashes without re-hashing and
//     counted as sampled out;
//   - any mismatch, AllBlocksCleared (which an engine restart and a queue
//     overflow also produce), a model change, or an index error recovery
//     returns the pod to full checking.
//
// Blocks skipped while sampling leave no digest in the model's digest cache,
// so a chain whose parent was skipped cannot be verified until a request
// starts a new one; that is why a due sample waits for a verifiable event
// rather than spending itself on one it cannot check.
const (
	// ParityProofBlocks consecutive matching blocks prove a pod's configuration.
	ParityProofBlocks = 1024
	// ParitySampleEvery is the sampling period, in BlockStored events, of a
	// proven pod.
	ParitySampleEvery = 64
)

// paritySampler is one pod's position in that state machine. It belongs to
// the goroutine applying the pod's batches.
type paritySampler struct {
	streak int  // consecutive matching blocks while checking in full
	proven bool // sampling
	since  int  // stored events since the last verified one, while sampling
}

// reset returns to full checking.
func (s *paritySampler) reset() { *s = paritySampler{} }

// check reports whether a stored event must be re-hashed; verifiable says
// whether it can be (token ids, block size and parent digest known).
func (s *paritySampler) check(verifiable bool) bool {
	if !s.proven {
		return true
	}
	s.since++
	if s.since < ParitySampleEvery || !verifiable {
		return false
	}
	s.since = 0
	return true
}

// matched records a matching block.
func (s *paritySampler) matched() {
	if !s.proven {
		if s.streak++; s.streak >= ParityProofBlocks {
			s.proven, s.since = true, 0
		}
	}
}

// storedUnchecked indexes a sampled-out event's blocks under the engine's
// hashes (or our keys where the pod has aliases), without re-hashing.
func (a *Applier) storedUnchecked(pod *podState, ev *event.Event, keys []blockkeys.Key, d *batchDelta) []blockkeys.Key {
	for _, eh := range ev.BlockHashes {
		k := blockkeys.Key(eh)
		if pod.alias != nil {
			if ak, ok := pod.alias.get(eh); ok {
				k = ak
			}
		}
		keys = append(keys, k)
	}
	d.sampledOut += uint64(len(ev.BlockHashes))
	return keys
}
