// Package chattemplate renders OpenAI chat requests into prompts exactly as
// vLLM's OpenAI server does before tokenizing: vLLM's message normalisation,
// then transformers' apply_chat_template with the model's Jinja2 chat
// template.
//
// The steps, in order:
//
//   - Template selection: chat_template.jinja in the tokenizer directory, else
//     tokenizer_config.json's "chat_template" (a string, or a list of named
//     templates from which "tool_use" is picked when the request carries
//     tools, else "default"); an explicit template overrides both.
//   - Content format (vLLM's "auto"): a template that loops over a message's
//     content (for x in message['content'], also through variables assigned
//     from messages, or a loop over a variable named content) gets content as
//     a list of {"type": "text", "text": ...} parts ("openai"); any other gets
//     a string, text parts joined with "\n".
//   - Message normalisation: only role, content, name, tool_calls (assistant),
//     reasoning / reasoning_content (assistant), tool_call_id (tool), task and
//     tools (developer) reach the template; tool messages' text parts are
//     always joined into a string; tool-call arguments given as JSON strings
//     are parsed into objects (invalid JSON or null becomes {}), and an empty
//     tool_calls list is dropped.
//   - Variables: messages, tools, documents, add_generation_prompt (default
//     true), the tokenizer's special tokens (bos_token, eos_token, ...) and
//     chat_template_kwargs, which may override add_generation_prompt,
//     continue_final_message and documents.
//   - continue_final_message: the prompt ends right after the final message's
//     text, found with transformers' marker technique.
//
// The Jinja2 engine is chattemplate/jinja; see its package comment for why it
// is our own.
package chattemplate

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvindex/kvindex/tokenization/chattemplate/jinja"
)

// ContentFormat is how message content is handed to a template.
type ContentFormat string

// The two content formats of vLLM's detection.
const (
	FormatString ContentFormat = "string"
	FormatOpenAI ContentFormat = "openai"
)

// RequestError is a request that cannot be rendered: malformed messages,
// conflicting options, or a template that raised or failed on this input.
// The daemon answers it with 400.
type RequestError struct{ Err error }

func (e *RequestError) Error() string { return e.Err.Error() }
func (e *RequestError) Unwrap() error { return e.Err }

func badRequest(format string, args ...any) error {
	return &RequestError{Err: fmt.Errorf(format, args...)}
}

type compiled struct {
	tmpl   *jinja.Template
	format ContentFormat
}

// Templates is one model's chat templates and special tokens. It is
// immutable and safe for concurrent use.
type Templates struct {
	single  *compiled            // a template given as one string or file
	named   map[string]*compiled // a named list ("default", "tool_use", ...)
	special map[string]any       // bos_token, eos_token, ... as template values
	now     func() time.Time
}

// Option configures Load.
type Option func(*Templates)

// WithClock sets strftime_now's clock (tests pin it; default time.Now).
func WithClock(now func() time.Time) Option { return func(t *Templates) { t.now = now } }

// ErrNoTemplate is a tokenizer without a chat template.
var ErrNoTemplate = errors.New("the tokenizer has no chat template; give one explicitly")

var specialTokenKeys = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "additional_special_tokens"}

// Load reads the templates and special tokens from tokenizer_config.json
// (config) and, when non-empty, a chat_template.jinja file (file), which
// wins over the config's template as in transformers. Template features
// the engine does not support fail here, with a *jinja.UnsupportedError.
func Load(config, file []byte, opts ...Option) (*Templates, error) {
	t := &Templates{special: map[string]any{}, now: time.Now}
	for _, o := range opts {
		o(t)
	}
	var cfg map[string]json.RawMessage
	if len(config) > 0 {
		if err := json.Unmarshal(config, &cfg); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: %w", err)
		}
	}
	for _, k := range specialTokenKeys {
		raw, ok := cfg[k]
		if !ok {
			continue
		}
		v, err := specialToken(raw, k == "additional_special_tokens")
		if err != nil {
			return nil, fmt.Errorf("tokenizer_config.json %s: %w", k, err)
		}
		if v != nil {
			t.special[k] = v
		}
	}
	if len(file) > 0 {
		c, err := compile(string(file))
		if err != nil {
			return nil, fmt.Errorf("chat_template.jinja: %w", err)
		}
		t.single = c
		return t, nil
	}
	raw, ok := cfg["chat_template"]
	if !ok || string(raw) == "null" {
		return t, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		c, err := compile(s)
		if err != nil {
			return nil, fmt.Errorf("tokenizer_config.json chat_template: %w", err)
		}
		t.single = c
		return t, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("tokenizer_config.json chat_template: neither a string nor a list of {name, template}: %w", err)
	}
	t.named = map[string]*compiled{}
	for _, nt := range list {
		c, err := compile(nt.Template)
		if err != nil {
			return nil, fmt.Errorf("tokenizer_config.json chat_template %q: %w", nt.Name, err)
		}
		t.named[nt.Name] = c
	}
	return t, nil
}

// LoadDir loads a tokenizer directory (tokenizer_config.json and, if
// present, chat_template.jinja). A non-empty templateFile overrides the
// directory's templates, like vLLM's --chat-template.
func LoadDir(dir, templateFile string, opts ...Option) (*Templates, error) {
	config, err := readConfig(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, err
	}
	path := templateFile
	if path == "" {
		path = filepath.Join(dir, "chat_template.jinja")
	}
	file, err := os.ReadFile(path)
	if err != nil && (templateFile != "" || !errors.Is(err, os.ErrNotExist)) {
		return nil, err
	}
	return Load(config, file, opts...)
}

// maxConfigBytes bounds tokenizer_config.json (real ones are well under
// 1 MiB, most of it added-token tables).
const maxConfigBytes = 64 << 20

// readConfig reads path, or path.gz decompressed (as the tokenization
// package accepts it); nil when neither exists.
func readConfig(path string) ([]byte, error) {
	b, err := readLimited(path, false)
	if errors.Is(err, os.ErrNotExist) {
		b, err = readLimited(path+".gz", true)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
	}
	return b, err
}

func readLimited(path string, gz bool) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if gz {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		r = zr
	}
	b, err := io.ReadAll(io.LimitReader(r, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(b) > maxConfigBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxConfigBytes)
	}
	return b, nil
}

func specialToken(raw json.RawMessage, list bool) (any, error) {
	one := func(raw json.RawMessage) (any, error) {
		var s *string
		if err := json.Unmarshal(raw, &s); err == nil {
			if s == nil {
				return nil, nil
			}
			return *s, nil
		}
		var added struct {
			Content *string `json:"content"`
		}
		if err := json.Unmarshal(raw, &added); err != nil || added.Content == nil {
			return nil, errors.New("neither a string nor an AddedToken with content")
		}
		return *added.Content, nil
	}
	if !list {
		return one(raw)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, err
	}
	out := &jinja.ListVal{}
	for _, it := range items {
		v, err := one(it)
		if err != nil {
			return nil, err
		}
		if v != nil {
			out.Items = append(out.Items, v)
		}
	}
	return out, nil
}

func compile(src string) (*compiled, error) {
	tmpl, err := jinja.Parse(src)
	if err != nil {
		return nil, err
	}
	return &compiled{tmpl: tmpl, format: detectFormat(tmpl)}, nil
}

// Request is one chat request's rendering inputs, as JSON from the body of
// an OpenAI /v1/chat/completions request.
type Request struct {
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools,omitempty"`
	Documents            json.RawMessage `json:"documents,omitempty"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage bool            `json:"continue_final_message,omitempty"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs,omitempty"`
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// pick selects the template for a request with or without tools.
func (t *Templates) pick(hasTools bool) (*compiled, error) {
	if t.single != nil {
		return t.single, nil
	}
	if t.named != nil {
		if hasTools {
			if c, ok := t.named["tool_use"]; ok {
				return c, nil
			}
		}
		if c, ok := t.named["default"]; ok {
			return c, nil
		}
		return nil, errors.New("the tokenizer has several chat templates and none is named \"default\"")
	}
	return nil, ErrNoTemplate
}

// ContentFormat reports the content format of the template a request with
// (or without) tools would use.
func (t *Templates) ContentFormat(hasTools bool) (ContentFormat, error) {
	c, err := t.pick(hasTools)
	if err != nil {
		return "", err
	}
	return c.format, nil
}

// apply_chat_template's own parameters: given in chat_template_kwargs they
// are consumed by it and never reach the template.
var hfParams = map[string]bool{
	"conversation": true, "tools": true, "documents": true, "chat_template": true, "add_generation_prompt": true,
	"continue_final_message": true, "tokenize": true, "padding": true, "truncation": true, "max_length": true,
	"return_tensors": true, "return_dict": true, "return_assistant_tokens_mask": true, "tokenizer_kwargs": true,
}

const continueTag = "CONTINUE_FINAL_MESSAGE_TAG "

// Render renders req into the prompt text vLLM would tokenize. Input and
// template errors are *RequestError (raise_exception's message is kept, as
// a *jinja.RaisedError inside); ErrNoTemplate when there is no template.
func (t *Templates) Render(req *Request) (string, error) {
	hasTools := !isNull(req.Tools)
	c, err := t.pick(hasTools)
	if err != nil {
		return "", err
	}
	vars := map[string]any{}
	for k, v := range t.special {
		vars[k] = v
	}
	addGen, cont := true, req.ContinueFinalMessage
	if req.AddGenerationPrompt != nil {
		addGen = *req.AddGenerationPrompt
	}
	var documents any
	if !isNull(req.Documents) {
		if documents, err = jinja.FromJSON(req.Documents); err != nil {
			return "", badRequest("documents: %v", err)
		}
		l, ok := documents.(*jinja.ListVal)
		if !ok {
			return "", badRequest("documents must be a list of objects")
		}
		for _, d := range l.Items {
			if _, ok := d.(*jinja.DictVal); !ok {
				return "", badRequest("documents must be a list of objects")
			}
		}
	}
	if !isNull(req.ChatTemplateKwargs) {
		kv, err := jinja.FromJSON(req.ChatTemplateKwargs)
		if err != nil {
			return "", badRequest("chat_template_kwargs: %v", err)
		}
		kw, ok := kv.(*jinja.DictVal)
		if !ok {
			return "", badRequest("chat_template_kwargs must be an object")
		}
		for _, k := range kw.Keys() {
			name := k.(string)
			v, _ := kw.Get(k)
			switch name {
			case "chat_template", "tokenize":
				return "", badRequest("chat_template_kwargs may not set %q", name)
			case "messages", "conversation", "tools":
				return "", badRequest("chat_template_kwargs may not set %q: it is a request field", name)
			case "add_generation_prompt":
				addGen = jinja.Truthy(v)
			case "continue_final_message":
				cont = jinja.Truthy(v)
			case "documents":
				documents = v
			default:
				if !hfParams[name] {
					vars[name] = v
				}
			}
		}
	}
	if cont && addGen {
		return "", badRequest("continue_final_message and add_generation_prompt cannot both be true")
	}
	messages, err := normalise(req.Messages, c.format)
	if err != nil {
		return "", &RequestError{Err: err}
	}
	var tools any
	if hasTools {
		if tools, err = jinja.FromJSON(req.Tools); err != nil {
			return "", badRequest("tools: %v", err)
		}
		if _, ok := tools.(*jinja.ListVal); !ok {
			return "", badRequest("tools must be a list")
		}
	}
	finalText := ""
	if cont {
		if finalText, err = markFinal(messages); err != nil {
			return "", &RequestError{Err: err}
		}
	}
	vars["messages"] = messages
	vars["tools"] = tools
	vars["documents"] = documents
	vars["add_generation_prompt"] = addGen
	out, err := c.tmpl.Render(jinja.Env{Now: t.now}, vars)
	if err != nil {
		return "", &RequestError{Err: err}
	}
	if cont {
		tag := strings.TrimSpace(continueTag)
		if !strings.Contains(out, strings.TrimFunc(finalText, jinja.IsPySpace)) || !strings.Contains(out, tag) {
			return "", badRequest("continue_final_message: the final message does not appear in the rendered chat (the template changes it)")
		}
		at := strings.LastIndex(out, tag)
		if strings.HasPrefix(out[at:], continueTag) {
			out = out[:at]
		} else {
			out = strings.TrimRightFunc(out[:at], jinja.IsPySpace)
		}
	}
	return out, nil
}

// markFinal appends the continuation marker to the final message's last
// text and returns that text, as transformers does.
func markFinal(messages *jinja.ListVal) (string, error) {
	if len(messages.Items) == 0 {
		return "", errors.New("continue_final_message needs at least one message")
	}
	last := messages.Items[len(messages.Items)-1].(*jinja.DictVal)
	content, _ := last.Get("content")
	switch c := content.(type) {
	case string:
		_ = last.Set("content", c+continueTag)
		return c, nil
	case *jinja.ListVal:
		for i := len(c.Items) - 1; i >= 0; i-- {
			part, ok := c.Items[i].(*jinja.DictVal)
			if !ok {
				continue
			}
			if txt, ok := part.Get("text"); ok {
				s, _ := txt.(string)
				_ = part.Set("text", s+continueTag)
				return s, nil
			}
		}
	}
	return "", errors.New("continue_final_message is set but the final message has no text to continue")
}
