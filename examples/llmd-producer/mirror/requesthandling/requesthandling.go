// Package requesthandling mirrors the tokenized-request types of llm-d-router's
// pkg/epp/framework/interface/requesthandling (types.go) at
// ebab687927f5331c1b39defcb579a07951bce56c (see package mirror).
package requesthandling

// Modality is a multimodal item's kind.
type Modality string

// InferenceRequestBody is the parsed request body; the mirror keeps only
// the parser's tokenization (upstream also has the per-API request forms).
type InferenceRequestBody struct {
	TokenizedRequest *TokenizedRequest
}

// TokenizedRequest is the token-producer's result: one entry per prompt.
type TokenizedRequest struct {
	Prompts   []PromptTokens
	CacheSalt string
}

// PromptTokens is one prompt's token ids and multimodal items.
type PromptTokens struct {
	TokenIDs           []uint32
	MultiModalFeatures []MultiModalFeature
}

// MultiModalFeature is one multimodal item of a prompt.
type MultiModalFeature struct {
	Modality Modality
	Hash     string
	Offset   int
	Length   int
}
