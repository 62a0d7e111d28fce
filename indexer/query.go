package indexer

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/tokenization/chattemplate"
)

// InputKind is which field of a Query carries the request.
type InputKind uint8

const (
	InputNone InputKind = iota
	InputTokens
	InputHashes
	InputPrompt
	// InputMessages is a chat request, rendered with the model's chat
	// template and tokenized as vLLM's chat endpoint does.
	InputMessages
	// NumInputKinds sizes per-kind tables (request metrics).
	NumInputKinds
)

var inputKindNames = [NumInputKinds]string{"none", "token_ids", "block_hashes", "prompt", "messages"}

func (k InputKind) String() string {
	if k < NumInputKinds {
		return inputKindNames[k]
	}
	return "unknown"
}

// MaxInputLen bounds one query (tokens or block hashes) so a client cannot
// make the indexer hash or look up unbounded input.
const MaxInputLen = 1 << 20

// Query is one name-level score request. Its slices are borrowed from the
// caller's decoded request and only read.
type Query struct {
	Model string
	Kind  InputKind
	// Exactly the field Kind names is read.
	TokenIDs    []uint32
	BlockHashes []uint64 // as the engine publishes them: already our keys
	Prompt      string
	// Chat is a chat request: messages, tools, documents,
	// add_generation_prompt (default true), continue_final_message and
	// chat_template_kwargs.
	Chat *chattemplate.Request
	// AddSpecialTokens overrides vLLM's default for a Prompt (true) or Chat
	// (false) input, as a request's add_special_tokens does; nil = default.
	AddSpecialTokens *bool
	// LoraName and CacheSalt enter the keys of TokenIDs, Prompt and Chat
	// inputs, as vLLM mixes them into a request's block hashes.
	LoraName  string
	CacheSalt string
	// Pods restricts the answer to these pod names (every DP rank of each);
	// empty = every pod.
	Pods []string
	// SessionID names the request's session (vLLM's BlockStored.session_id):
	// pods that stored blocks for it are preferred when prefixes tie
	// (session.go). Empty = none.
	SessionID string
}

func (q *Query) validate() *Error {
	switch q.Kind {
	case InputTokens:
		if len(q.TokenIDs) == 0 {
			return errorf(InvalidArgument, "token_ids is empty")
		}
		if len(q.TokenIDs) > MaxInputLen {
			return errorf(InvalidArgument, "token_ids has %d entries, limit %d", len(q.TokenIDs), MaxInputLen)
		}
	case InputHashes:
		if len(q.BlockHashes) == 0 {
			return errorf(InvalidArgument, "block_hashes is empty")
		}
		if len(q.BlockHashes) > MaxInputLen {
			return errorf(InvalidArgument, "block_hashes has %d entries, limit %d", len(q.BlockHashes), MaxInputLen)
		}
		if q.LoraName != "" || q.CacheSalt != "" {
			return errorf(InvalidArgument, "lora_name and cache_salt apply to token_ids, prompt or messages, not to block_hashes (they are already part of the hashes)")
		}
	case InputPrompt:
		if q.Prompt == "" {
			return errorf(InvalidArgument, "prompt is empty")
		}
		if q.Model == "" {
			return errorf(InvalidArgument, "model is required to tokenize a prompt")
		}
	case InputMessages:
		if q.Chat == nil || isNullJSON(q.Chat.Messages) {
			return errorf(InvalidArgument, "messages is empty")
		}
		if q.Model == "" {
			return errorf(InvalidArgument, "model is required to render messages")
		}
	default:
		return errorf(InvalidArgument, "one of token_ids, block_hashes, prompt or messages is required (non-empty)")
	}
	if len(q.SessionID) > event.MaxSessionIDLen {
		return errorf(InvalidArgument, "session_id is longer than %d bytes", event.MaxSessionIDLen)
	}
	if q.AddSpecialTokens != nil && q.Kind != InputPrompt && q.Kind != InputMessages {
		return errorf(InvalidArgument, "add_special_tokens applies to prompt or messages only")
	}
	for _, p := range q.Pods {
		if p == "" {
			return errorf(InvalidArgument, "pods contains an empty name")
		}
	}
	return nil
}

func isNullJSON(raw []byte) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// TierCounts are the blocks of a matched run per storage tier.
type TierCounts [event.NumTiers]int32

// RankScore is one data-parallel rank's match.
type RankScore struct {
	DPRank        int
	MatchedBlocks int
	Score         float64
	Tiers         TierCounts
	// TierRuns: per tier on its own, the run of blocks from block 0 held
	// on that tier (kvindex.PodScore.TierRuns).
	TierRuns TierCounts
}

// PodResult is one pod (all its DP ranks) in a score answer. The pod's match
// is its best rank's: a request is served by exactly one rank.
type PodResult struct {
	Pod           string
	MatchedBlocks int
	MatchedTokens int64
	Score         float64
	Tiers         TierCounts
	TierRuns      TierCounts  // the best rank's, see RankScore
	Ranks         []RankScore // best first; never empty
	// Session: the query named a session and this pod stored blocks for it.
	Session bool
	// ApplyLag is how late the index may be for this pod: the largest apply
	// lag of its DP ranks (kvevents.StreamStats.ApplyLag: the age of the
	// oldest batch still waiting to be applied), scored or not; 0 when none
	// waits. A pod whose fresh blocks are still queued can hold more than
	// its score says.
	ApplyLag time.Duration
	// Complete is false when the event stream of a rank in Ranks is known
	// to be incomplete (kvevents.StreamStats.Complete): the index may lack
	// blocks the pod holds, or hold blocks it dropped. IncompleteReason is
	// then that rank's reason (the lowest such rank's). A rank whose stream
	// this daemon does not track (another daemon's, on a shared index)
	// counts as complete.
	Complete         bool
	IncompleteReason string
}

// Result is the answer to one Query: pods best first (score, then matched
// blocks, then name). A later Pick would choose one of these same entries.
//
// The caller owns a Result and passes it to Score, which overwrites it: a
// Result reused across calls (pooled by a server, kept by a simulator)
// carries its buffers along, so scoring allocates nothing per block or pod.
// The Pods and Ranks slices are valid until the next Score or Reset on it.
type Result struct {
	TotalBlocks int // full blocks in the query that were scored
	BlockSize   int // tokens per block for the query's model
	// UnscoredReason says why the prompt goes on past its TotalBlocks
	// unscored: "media" for a chat request with an image, audio or video
	// item, whose blocks from the first media item on carry the media's
	// hash, which the request does not give. Empty when every full block
	// of the prompt was scored.
	UnscoredReason string
	// IndexRebuilding is how many pods' streams still say "index_lost": the
	// backend lost entries (a Redis restart, flush or eviction) and their
	// state is not rebuilt yet, so the answer may lack pods that hold the
	// prompt (an empty answer then means "rebuilding", not "held nowhere").
	// 0 when no rebuild is pending.
	IndexRebuilding int
	Pods            []PodResult

	keys    []blockkeys.Key
	ek      engineKeys
	cands   []kvindex.PodID
	res     kvindex.ScoreResult
	ranks   []RankScore
	entries []rankEntry
	byName  map[string]int
	names   []string        // entries' pod names
	ids     []kvindex.PodID // entries' pods
	order   []podKey
	bits    []uint64 // orderByName's bitmap over name places, zero between calls
	byPlace []podKey // orderByName: a run's keys by name place
	// nameFilter, when set, keeps only these pod names (a pods filter naming
	// pods this process has not interned yet, on a shared index).
	nameFilter []string
	sess       []kvindex.PodID // the query session's pods
	streams    streamBufs
}

type rankEntry struct {
	pod int
	RankScore
}

// maxKeptKeys bounds the key buffer a Result keeps across Reset, so one huge
// request does not pin memory in a pool.
const maxKeptKeys = 1 << 16

// Reset empties r and drops oversized buffers; call it before pooling r.
func (r *Result) Reset() {
	if cap(r.keys) > maxKeptKeys {
		r.keys = nil
	}
	r.streams.reset()
	r.clear()
}

func (r *Result) clear() {
	r.TotalBlocks, r.BlockSize, r.UnscoredReason, r.IndexRebuilding = 0, 0, "", 0
	clear(r.byName)
	for i := range r.Pods {
		r.Pods[i] = PodResult{}
	}
	r.Pods = r.Pods[:0]
	r.ranks = r.ranks[:0]
	r.keys = r.keys[:0]
	r.ek.clear()
	r.nameFilter = nil
}

// Code classifies an Error independently of any transport; api maps it to
// a gRPC code and an HTTP status.
type Code uint8

const (
	// InvalidArgument: the query is malformed (HTTP 400).
	InvalidArgument Code = iota + 1
	// FailedPrecondition: the query is valid but cannot be answered with this
	// configuration (no tokenizer for the model; HTTP 422).
	FailedPrecondition
	// Unavailable: the index cannot be read now (HTTP 503); never answered
	// with an empty score, which would look like a cache miss.
	Unavailable
	// DeadlineExceeded and Canceled: the caller's context ended.
	DeadlineExceeded
	Canceled
	// ResourceExhausted: a shared budget is in use by other requests (HTTP
	// 429); the same query may succeed later.
	ResourceExhausted
	// NotFound: the query names something the daemon does not hold (a pick
	// id no longer awaiting feedback; HTTP 404).
	NotFound
)

var codeNames = [...]string{"", "InvalidArgument", "FailedPrecondition", "Unavailable", "DeadlineExceeded", "Canceled", "ResourceExhausted", "NotFound"}

func (c Code) String() string {
	if int(c) < len(codeNames) && c != 0 {
		return codeNames[c]
	}
	return fmt.Sprintf("Code(%d)", uint8(c))
}

// Error is a failed query with the reason for the caller.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

func errorf(c Code, format string, args ...any) *Error {
	return &Error{Code: c, Msg: fmt.Sprintf(format, args...)}
}
