package api

import (
	"net/http"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/indexer"
)

// handlePeerSnapshot streams a copy of the in-memory index in the snapshot
// format for a peer starting empty (indexer/peer.go). The guard has checked
// the admin scope. A peer whose block keys are computed otherwise is
// refused before anything is written: the copy would answer none of its
// queries. One copy is streamed at a time (each walks the whole index);
// another asker gets 503 and tries its next peer.
func (s *Server) handlePeerSnapshot(w http.ResponseWriter, r *http.Request) {
	if !s.idx.CanSnapshot() {
		writeError(w, errorf(codes.Unimplemented, "this daemon's index is Redis, which its peers share: there is no copy to give"))
		return
	}
	own := s.idx.HashConfigID()
	if got := r.Header.Get(indexer.HashConfigHeader); got != own {
		s.peerCopies.WithLabelValues("hash_config").Inc()
		s.log.Warn("peer copy refused: the asking daemon's block-key configuration differs", "remote", r.RemoteAddr,
			"theirs", got, "ours", own)
		writeErrorStatus(w, http.StatusConflict, errorf(codes.FailedPrecondition,
			"block-key configuration %q differs from this daemon's %q (--hash-algo, --hash-seed, --block-size, per-model keys)", got, own))
		return
	}
	select {
	case s.peerCopy <- struct{}{}:
		defer func() { <-s.peerCopy }()
	default:
		s.peerCopies.WithLabelValues("busy").Inc()
		w.Header().Set("Retry-After", "1")
		writeError(w, errorf(codes.Unavailable, "another peer's copy is being streamed"))
		return
	}
	// The copy may take longer than an API answer: the asker's own
	// deadline (--peer-timeout) bounds it.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(10 * time.Minute))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set(indexer.HashConfigHeader, own)
	t0 := time.Now()
	wr, err := s.idx.WriteSnapshot(w)
	if err != nil {
		// The status is sent: the asker sees a truncated copy, which its
		// checksum refuses.
		s.peerCopies.WithLabelValues("error").Inc()
		s.log.Warn("peer copy interrupted", "remote", r.RemoteAddr, "err", err)
		return
	}
	s.peerCopies.WithLabelValues("ok").Inc()
	s.log.Info("index copy streamed to a peer", "remote", r.RemoteAddr, "entries", wr.Entries, "bytes", wr.Bytes,
		"took", time.Since(t0).Round(time.Millisecond))
}
