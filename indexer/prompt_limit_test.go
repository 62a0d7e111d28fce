package indexer

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/prefixstore"
)

// The prefix store stops tokenizing at the same bound the indexer puts on
// token_ids, and its refusal is the caller's fault (InvalidArgument, the
// limit in the message) for prompts and rendered messages alike.
func TestPromptTokenLimitIsTheInputBound(t *testing.T) {
	if prefixstore.DefaultMaxPromptTokens != MaxInputLen {
		t.Fatalf("prefixstore.DefaultMaxPromptTokens = %d, MaxInputLen = %d", prefixstore.DefaultMaxPromptTokens, MaxInputLen)
	}
	err := fmt.Errorf("%w: more than the limit %d", prefixstore.ErrTooManyTokens, MaxInputLen)
	for _, what := range []string{"prompt", "rendered messages"} {
		e := promptLimitError(what, fmt.Errorf("wrapped: %w", err))
		if e == nil || e.Code != InvalidArgument {
			t.Fatalf("%s: %v, want InvalidArgument", what, e)
		}
	}
}
