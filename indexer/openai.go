package indexer

import (
	"bytes"
	"encoding/json"

	"github.com/kvindex/kvindex/tokenization/chattemplate"
)

// openAIRequest is what scoring reads from an OpenAI /v1/chat/completions or
// /v1/completions body; every other field (sampling parameters, stream,
// user, ...) is ignored, as a router forwards bodies unchanged.
type openAIRequest struct {
	Model                string          `json:"model"`
	Messages             json.RawMessage `json:"messages"`
	Prompt               json.RawMessage `json:"prompt"`
	Tools                json.RawMessage `json:"tools"`
	Documents            json.RawMessage `json:"documents"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage *bool           `json:"continue_final_message"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	ReasoningEffort      *string         `json:"reasoning_effort"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	CacheSalt            *string         `json:"cache_salt"`
	ChatTemplate         *string         `json:"chat_template"`
	PromptEmbeds         json.RawMessage `json:"prompt_embeds"`
}

// SetOpenAIRequest fills q from a router's request body as received: a
// /v1/chat/completions body (it has "messages") becomes a messages input
// with its tools, documents, add_generation_prompt, continue_final_message,
// chat_template_kwargs, reasoning_effort and add_special_tokens; a /v1/completions body
// becomes a prompt input (a string or a list with one string) or a
// token_ids input (token ids, or a list with one list of them).
//
// q.Model, when set, is the base model kvindex knows (tokenizer, chat
// template, key config); the body's "model" is then the name the engine
// serves, and a different one names a LoRA adapter, which vLLM mixes into
// the block hashes by that name (q.LoraName, unless already set). With
// q.Model empty the body's model is used. The body's cache_salt sets
// q.CacheSalt unless already set. Errors are *Error (InvalidArgument, or
// FailedPrecondition for what vLLM only does when configured for it).
func (q *Query) SetOpenAIRequest(body []byte) error {
	var b openAIRequest
	if err := json.Unmarshal(body, &b); err != nil {
		return errorf(InvalidArgument, "request: not an OpenAI request object: %v", err)
	}
	switch {
	case q.Model == "":
		q.Model = b.Model
	case b.Model != "" && b.Model != q.Model && q.LoraName == "":
		q.LoraName = b.Model
	}
	if b.CacheSalt != nil && q.CacheSalt == "" {
		q.CacheSalt = *b.CacheSalt
	}
	q.AddSpecialTokens = b.AddSpecialTokens
	hasMessages, hasPrompt := !isNullJSON(b.Messages), !isNullJSON(b.Prompt)
	switch {
	case hasMessages && hasPrompt:
		return errorf(InvalidArgument, "request: has both messages (chat) and prompt (completions)")
	case hasMessages:
		if b.ChatTemplate != nil && *b.ChatTemplate != "" {
			return errorf(FailedPrecondition, "request: a chat_template in the request is not used by kvindex; configure the model's template instead (models.<name>.chat_template)")
		}
		q.Kind = InputMessages
		q.Chat = &chattemplate.Request{Messages: b.Messages, Tools: b.Tools, Documents: b.Documents,
			AddGenerationPrompt: b.AddGenerationPrompt, ChatTemplateKwargs: b.ChatTemplateKwargs,
			ReasoningEffort: b.ReasoningEffort}
		if b.ContinueFinalMessage != nil {
			q.Chat.ContinueFinalMessage = *b.ContinueFinalMessage
		}
		return nil
	case hasPrompt:
		return q.setCompletionPrompt(b.Prompt)
	case !isNullJSON(b.PromptEmbeds):
		return errorf(InvalidArgument, "request: prompt_embeds cannot be scored (no token ids)")
	}
	return errorf(InvalidArgument, "request: neither messages (chat) nor prompt (completions)")
}

// setCompletionPrompt accepts the prompt forms of /v1/completions that name
// one prompt: "text", ["text"], [ids...], [[ids...]].
func (q *Query) setCompletionPrompt(raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	var one string
	if json.Unmarshal(raw, &one) == nil {
		q.Kind, q.Prompt = InputPrompt, one
		return nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		if len(texts) != 1 {
			return errorf(InvalidArgument, "request: prompt lists %d prompts; score one request at a time", len(texts))
		}
		q.Kind, q.Prompt = InputPrompt, texts[0]
		return nil
	}
	var ids []uint32
	// Token ids are tokenized already: add_special_tokens does not apply.
	if json.Unmarshal(raw, &ids) == nil {
		q.Kind, q.TokenIDs, q.AddSpecialTokens = InputTokens, ids, nil
		return nil
	}
	var batch [][]uint32
	if json.Unmarshal(raw, &batch) == nil {
		if len(batch) != 1 {
			return errorf(InvalidArgument, "request: prompt lists %d token-id prompts; score one request at a time", len(batch))
		}
		q.Kind, q.TokenIDs, q.AddSpecialTokens = InputTokens, batch[0], nil
		return nil
	}
	return errorf(InvalidArgument, "request: prompt must be a string, a list with one string, or token ids in [0, 2^32)")
}

// chatJSON is the chat input as one JSON object (gRPC's chat_json).
type chatJSON struct {
	chattemplate.Request
	AddSpecialTokens *bool `json:"add_special_tokens,omitempty"`
}

// SetChatJSON makes q a messages input from a JSON object with messages
// and, optionally, tools, documents, add_generation_prompt,
// continue_final_message, chat_template_kwargs, reasoning_effort and
// add_special_tokens.
// Unknown fields are refused: a misspelt option would otherwise change the
// rendering silently. Errors are *Error.
func (q *Query) SetChatJSON(raw []byte) error {
	var c chatJSON
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return errorf(InvalidArgument, "chat_json: %v", err)
	}
	if dec.More() {
		return errorf(InvalidArgument, "chat_json: trailing data after the object")
	}
	q.Kind, q.Chat, q.AddSpecialTokens = InputMessages, &c.Request, c.AddSpecialTokens
	return nil
}
