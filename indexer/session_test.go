package indexer

import (
	"testing"

	"github.com/kvindex/kvindex/kvevents/event"
)

// A query naming a session puts the session's pod first among pods whose
// prefixes tie, and only there: a longer match still wins. Pick chooses the
// session's candidate when it ties with the policy's choice.
func TestSessionPreferredOnTies(t *testing.T) {
	// no speculation: every pick below sees the index alone
	ix := newTestIndexer(t, Config{Pick: PickConfig{SpeculativeTTL: -1, HistoryTTL: -1}})
	prompt := seqTokens(5000, 4*testBlock)
	withSession := func(ev event.Event, s string) event.Event { ev.SessionID = s; return ev }
	apply(ix, "pod-a", 0, storeEvent(prompt, 2, event.TierGPU))
	apply(ix, "pod-b", 0, withSession(storeEvent(prompt, 2, event.TierGPU), "chat-7"))
	apply(ix, "pod-c", 0, withSession(storeEvent(prompt, 1, event.TierGPU), "chat-9"))
	q := &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}
	var r Result
	const plain = "total=4 pod-a:2/8/2.00[0:2,] pod-b:2/8/2.00[0:2,] pod-c:1/4/1.00[0:1,]"
	if got := mustScore(t, ix, q, &r); got != plain {
		t.Fatalf("no session: %s", got)
	}
	q.SessionID = "chat-7"
	if got := mustScore(t, ix, q, &r); got != "total=4 pod-b:2/8/2.00[0:2,] pod-a:2/8/2.00[0:2,] pod-c:1/4/1.00[0:1,]" || !r.Pods[0].Session || r.Pods[1].Session {
		t.Fatalf("chat-7: %s %+v", got, r.Pods)
	}
	q.SessionID = "chat-9" // pod-c's match is shorter: the session does not lift it
	if got := mustScore(t, ix, q, &r); got != plain || !r.Pods[2].Session {
		t.Fatalf("chat-9: %s", got)
	}
	q.SessionID = "unknown"
	if got := mustScore(t, ix, q, &r); got != plain {
		t.Fatalf("unknown session: %s", got)
	}

	var pr PickResult
	pq := &PickQuery{Query: Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt},
		Candidates: []Candidate{idle("pod-a"), idle("pod-b"), idle("pod-c")}}
	mustPick(t, ix, pq, &pr)
	if pr.Pod != "pod-a" {
		t.Fatalf("no session: picked %s", pr.Pod)
	}
	pq.SessionID = "chat-7"
	mustPick(t, ix, pq, &pr)
	if pr.Pod != "pod-b" || !cand(&pr, "pod-b").Session || cand(&pr, "pod-a").Session {
		t.Fatalf("chat-7: picked %s %+v", pr.Pod, pr.Candidates)
	}
	pq.SessionID = "chat-9"
	mustPick(t, ix, pq, &pr)
	if pr.Pod != "pod-a" || !cand(&pr, "pod-c").Session {
		t.Fatalf("chat-9: picked %s %+v", pr.Pod, pr.Candidates)
	}
	// a load difference is not a tie: the policy's choice stands
	pq.SessionID = "chat-7"
	pq.Candidates[1].Waiting = 5
	mustPick(t, ix, pq, &pr)
	if pr.Pod != "pod-a" {
		t.Fatalf("loaded session pod: picked %s %+v", pr.Pod, pr.Candidates)
	}
}

// An overlong session id is a bad request, not a silent miss.
func TestSessionIDTooLong(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	long := make([]byte, event.MaxSessionIDLen+1)
	for i := range long {
		long[i] = 's'
	}
	var r Result
	err := ix.Score(t.Context(), &Query{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens(1, testBlock), SessionID: string(long)}, &r)
	if e, ok := err.(*Error); !ok || e.Code != InvalidArgument {
		t.Fatalf("err %v", err)
	}
	// the bound is inclusive: an id of exactly the longest length is taken
	if err := ix.Score(t.Context(), &Query{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens(1, testBlock), SessionID: string(long[1:])}, &r); err != nil {
		t.Fatalf("a session id of %d bytes: %v", event.MaxSessionIDLen, err)
	}
}
