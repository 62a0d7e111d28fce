package kvevents

import (
	"errors"

	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// A connection that ends in the middle of a message (the transport closed
// it: buffer budget, message timeout, size caps; or the peer vanished) has
// lost that message, and the message may have been any stream's that
// arrives on the connection. Those streams are marked incomplete at once,
// with reason "message_lost": an idle pod whose BlockRemoved was lost would
// otherwise stay complete while the index keeps blocks it no longer holds.
// Their next batch settles it: the next sequence number means nothing of
// theirs was lost and the mark goes; a gap is handled like any gap (replay,
// snapshot, or "gap").
//
// A connection that ends between messages (the peer closed it or died:
// an engine killed with SIGKILL has its sockets closed by the kernel; a
// reset, a heartbeat or idle timeout) marks its streams incomplete too,
// with reason "disconnected": nothing the pod does from then on reaches the
// daemon, so its blocks are scored as a dead engine's would be, not as
// complete. The same next batch settles it, on whatever connection it
// arrives (the engine's reconnect, or the daemon's redial): the next
// sequence number restores what the stream said before, a gap is replayed
// or stays "gap", a restart clears the pod. A pod that never comes back is
// silent, so the pod expiry (--pod-expiry) clears and forgets it.

// disconnected is the transport's OnDisconnect hook; err is nil when the
// daemon closed the socket itself (shutdown, an endpoint removed).
func (s *Subscriber) disconnected(peer string, err error) {
	if s == nil || err == nil {
		return
	}
	why := whyDisconnected
	if errors.Is(err, zmtp.ErrMessageLost) {
		why = whyMessageLost
	}
	s.mu.Lock()
	var hit []*stream
	for _, st := range s.streams {
		st.mu.Lock()
		if st.peer == peer {
			hit = append(hit, st)
		}
		st.mu.Unlock()
	}
	s.mu.Unlock()
	for _, st := range hit {
		if !st.markLost(why) {
			continue
		}
		if why == whyMessageLost {
			s.warn(peer+"|"+st.key.pod, "a message was cut short on the connection this pod publishes on: pod marked incomplete until its next batch",
				"pod", st.key.pod, "dp_rank", st.key.rank, "peer", peer, "err", err)
		} else {
			s.warn(peer+"|"+st.key.pod, "the connection this pod publishes on ended: pod marked incomplete (disconnected) until its next batch",
				"pod", st.key.pod, "dp_rank", st.key.rank, "peer", peer, "err", err)
		}
	}
}

// markLost marks the stream incomplete (why: "message_lost" or
// "disconnected"), keeping what it said before for lostResolved; false if
// it already was.
func (st *stream) markLost(why string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.lostFrom != nil {
		return false
	}
	before := st.completionLocked()
	st.setCompletionLocked(completion{since: st.stats.LastSeq + 1, why: why})
	st.lostFrom = &before
	return true
}

// lostResolved is called for a batch that leaves completeness unchanged
// (the next sequence number, or a gap replay repaired): the lost message
// was not the stream's, so it says again what it said before.
func (st *stream) lostResolved() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.lostFrom != nil {
		st.setCompletionLocked(*st.lostFrom)
	}
}
