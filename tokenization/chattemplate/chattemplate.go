// Package chattemplate renders OpenAI chat requests into prompts exactly as
// vLLM's OpenAI server does before tokenizing: the request model's
// validation, vLLM's message parsing, then transformers' apply_chat_template
// with the model's Jinja2 chat template.
//
// The steps, in order (docs/chat.md lists every rule with its vLLM source;
// normalise.go re-expresses them function by function):
//
//   - Validation: what vLLM answers with 400 is a *RequestError (tool calls
//     whose arguments are not a JSON string, an empty tools list, documents
//     with non-string values, unknown content parts, ...).
//   - Template selection: the processor's template (chat_template.jinja, else
//     chat_template.json) for a request without tools, else
//     chat_template.jinja or tokenizer_config.json's "chat_template" (a
//     string, or a named list from which "tool_use" is picked with tools,
//     else "default"); an explicit template overrides all.
//   - Content format (vLLM's "auto"): a template that loops over a message's
//     content gets a list of parts ("openai"); any other a string, text parts
//     joined with "\n".
//   - Message parsing: vLLM's keys in vLLM's order, tool calls rebuilt in the
//     request model's field order with their arguments parsed, tool messages'
//     text parts joined, media items as {"type": "image"} ("openai").
//   - Variables: messages, tools (as vLLM dumps them), documents,
//     add_generation_prompt, the special tokens and chat_template_kwargs, the
//     request's own fields winning over the kwargs.
//   - continue_final_message: the prompt ends right after the final message's
//     text, found with transformers' marker technique.
//
// A request with media renders to a Prompt that says where the first media
// item starts (MediaAt), so that only the tokens before it are scored.
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
	single *compiled            // a template given as one string or file
	named  map[string]*compiled // a named list ("default", "tool_use", ...)
	// processor is the multimodal processor's template (chat_template.json),
	// which vLLM prefers for requests without tools.
	processor    *compiled
	processorSrc string
	special      map[string]any // bos_token, eos_token, ... as template values
	now          func() time.Time
}

// Option configures Load.
type Option func(*Templates)

// WithProcessorTemplate sets the processor's chat template (the
// "chat_template" of a model's chat_template.json), which vLLM uses before
// the tokenizer's for a request without tools.
func WithProcessorTemplate(src string) Option { return func(t *Templates) { t.processorSrc = src } }

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
	if t.processorSrc != "" {
		c, err := compile(t.processorSrc)
		if err != nil {
			return nil, fmt.Errorf("chat_template.json: %w", err)
		}
		t.processor = c
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
	if templateFile == "" && len(file) == 0 {
		// A multimodal model's processor template: transformers' processor
		// reads chat_template.jinja first (then shared with the tokenizer),
		// else chat_template.json.
		proc, err := readLimited(filepath.Join(dir, "chat_template.json"), false)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		if len(proc) > 0 {
			var pj struct {
				ChatTemplate string `json:"chat_template"`
			}
			if err := json.Unmarshal(proc, &pj); err != nil {
				return nil, fmt.Errorf("chat_template.json: %w", err)
			}
			opts = append(opts[:len(opts):len(opts)], WithProcessorTemplate(pj.ChatTemplate))
		}
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
	// ReasoningEffort is the request's reasoning_effort: vLLM hands it to
	// the template and, unless chat_template_kwargs sets enable_thinking,
	// sets enable_thinking = (effort != "none").
	ReasoningEffort *string `json:"reasoning_effort,omitempty"`
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// pick selects the template for a request with or without tools, as
// vLLM's renderers/hf.py resolve_chat_template: the processor's template
// unless the request has tools, then the tokenizer's.
func (t *Templates) pick(hasTools bool) (*compiled, error) {
	if !hasTools && t.processor != nil {
		return t.processor, nil
	}
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
	if t.processor != nil {
		return t.processor, nil
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

// reasoningEfforts are the values ChatCompletionRequest.reasoning_effort accepts.
var reasoningEfforts = map[string]bool{"none": true, "minimal": true, "low": true, "medium": true, "high": true, "xhigh": true, "max": true}

const continueTag = "CONTINUE_FINAL_MESSAGE_TAG "

// Stand-ins for media items in the passes that locate the first one: they
// differ from each other in their first byte, so two renders diverge where
// the first media item starts.
const (
	mediaStandInA = "\x00kvindex-media-a\x00"
	mediaStandInB = "\x01kvindex-media-b\x01"
)

// Prompt is a rendered chat request.
type Prompt struct {
	// Text is the prompt vLLM renders. With media in a "string"-format
	// template (Cut), only Text[:MediaAt] is vLLM's: the model's own
	// placeholder, which this package does not know, follows there.
	Text string
	// MediaAt is the byte offset in Text where the first media item (image,
	// audio, video) starts; -1 without media. vLLM replaces the media items'
	// placeholder tokens by the model's multimodal tokens and mixes the
	// media's hashes into those blocks, so only the text before is exact.
	MediaAt int
	// Cut reports that Text ends at MediaAt and the token vLLM has at the
	// boundary is not known (the placeholder may merge with it).
	Cut bool
}

// Render renders req into the prompt vLLM would tokenize. Input and
// template errors are *RequestError (raise_exception's message is kept, as
// a *jinja.RaisedError inside); ErrNoTemplate when there is no template.
func (t *Templates) Render(req *Request) (Prompt, error) {
	r, err := t.prepare(req)
	if err != nil {
		return Prompt{}, err
	}
	md := &media{}
	out, err := r.render(md)
	if err != nil || !md.seen {
		return Prompt{Text: out, MediaAt: -1}, err
	}
	// Media: find where the first item starts by rendering the request
	// again with media items as plain text and taking the common prefix.
	// In "openai" format the first render is vLLM's prompt (the template
	// renders {"type": "image"} itself); in "string" format vLLM puts the
	// model's placeholder in front of the message, so both passes use
	// stand-ins and the prompt is exact only up to the divergence.
	alt := &media{text: mediaStandInB}
	if r.c.format == FormatString {
		md = &media{text: mediaStandInA}
		if out, err = r.render(md); err != nil {
			return Prompt{}, err
		}
	}
	other, err := r.render(alt)
	if err != nil {
		return Prompt{}, err
	}
	at := commonPrefix(out, other)
	if r.c.format == FormatString {
		return Prompt{Text: out[:at], MediaAt: at, Cut: true}, nil
	}
	return Prompt{Text: out, MediaAt: at}, nil
}

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			// Back to a UTF-8 boundary so the prefix is valid text.
			for i > 0 && a[i]&0xC0 == 0x80 {
				i--
			}
			return i
		}
	}
	return n
}

// prepared is a validated request ready to render.
type prepared struct {
	t         *Templates
	c         *compiled
	req       *Request
	vars      map[string]any
	cont      bool
	tools     any
	documents any
}

// prepare validates req as vLLM's request model and merges its template
// variables (chat_completion/protocol.py ChatCompletionRequest,
// build_chat_params; renderers/params.py merge_kwargs; renderers/hf.py
// resolve_chat_template_kwargs).
func (t *Templates) prepare(req *Request) (*prepared, error) {
	addGen, cont := true, req.ContinueFinalMessage
	if req.AddGenerationPrompt != nil {
		addGen = *req.AddGenerationPrompt
	}
	// check_generation_prompt: on the request's own fields.
	if cont && addGen {
		return nil, badRequest("continue_final_message and add_generation_prompt cannot both be true")
	}
	if req.ReasoningEffort != nil && !reasoningEfforts[*req.ReasoningEffort] {
		return nil, badRequest("reasoning_effort %s is not one of none, minimal, low, medium, high, xhigh, max", *req.ReasoningEffort)
	}
	var documents any
	if !isNull(req.Documents) {
		var err error
		if documents, err = jinja.FromJSON(req.Documents); err != nil {
			return nil, badRequest("documents: %v", err)
		}
		if err := checkDocuments(documents); err != nil {
			return nil, &RequestError{Err: err}
		}
	}
	var tools any
	hasTools := !isNull(req.Tools)
	if hasTools {
		l, err := normaliseTools(req.Tools)
		if err != nil {
			return nil, &RequestError{Err: err}
		}
		tools = l
	}
	c, err := t.pick(hasTools)
	if err != nil {
		return nil, err
	}
	vars := map[string]any{}
	for k, v := range t.special {
		vars[k] = v
	}
	userThinking := false
	if !isNull(req.ChatTemplateKwargs) {
		kv, err := jinja.FromJSON(req.ChatTemplateKwargs)
		if err != nil {
			return nil, badRequest("chat_template_kwargs: %v", err)
		}
		kw, ok := kv.(*jinja.DictVal)
		if !ok {
			return nil, badRequest("chat_template_kwargs must be an object")
		}
		for _, k := range kw.Keys() {
			name := k.(string)
			v, _ := kw.Get(k)
			switch name {
			case "chat_template":
				// The server refuses a request-supplied template unless it
				// trusts them (--trust-request-chat-template); kvindex uses
				// the configured one only.
				return nil, badRequest("chat_template_kwargs may not set %s", name)
			case "messages", "conversation", "tools":
				return nil, badRequest("chat_template_kwargs may not set %s: it is a request field", name)
			case "add_generation_prompt", "continue_final_message":
				// merge_kwargs: the request's own field (never None) wins.
			case "documents":
				if documents == nil {
					documents = v
				}
			case "enable_thinking":
				userThinking = true
				vars[name] = v
			default:
				// tokenize is safe_apply_chat_template's own parameter (it
				// only picks the return type); the others are
				// apply_chat_template's.
				if !hfParams[name] {
					vars[name] = v
				}
			}
		}
	}
	if e := req.ReasoningEffort; e != nil {
		vars["reasoning_effort"] = *e
		if !userThinking {
			vars["enable_thinking"] = *e != "none"
		}
	}
	vars["tools"] = tools
	vars["documents"] = documents
	vars["add_generation_prompt"] = addGen
	return &prepared{t: t, c: c, req: req, vars: vars, cont: cont, tools: tools, documents: documents}, nil
}

// render runs the template once, media items rendered as md says.
func (r *prepared) render(md *media) (string, error) {
	messages, err := normalise(r.req.Messages, r.c.format, md)
	if err != nil {
		return "", &RequestError{Err: err}
	}
	finalText := ""
	if r.cont {
		if finalText, err = markFinal(messages); err != nil {
			return "", &RequestError{Err: err}
		}
	}
	vars := make(map[string]any, len(r.vars)+1)
	for k, v := range r.vars {
		vars[k] = v
	}
	vars["messages"] = messages
	out, err := r.c.tmpl.Render(jinja.Env{Now: r.t.now}, vars)
	if err != nil {
		return "", &RequestError{Err: err}
	}
	if r.cont {
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

// Tokens are a chat request's token ids as vLLM's server computes them, as
// far as they are known.
type Tokens struct {
	IDs []uint32
	// Unscored says why the prompt goes on past IDs ("media": an image,
	// audio or video item starts there); empty when IDs are the whole prompt.
	Unscored string
	// Rendered is how long rendering the template took, when the renderer
	// measured it (chatprompt.Renderer does): the caller's per-stage
	// latency separates render from tokenize with it. 0 = not measured.
	Rendered time.Duration
}

// UnscoredMedia is Tokens.Unscored for a prompt cut at its first media item.
const UnscoredMedia = "media"

// Tokenize tokenizes p with encode (the model's tokenizer, with or without
// special tokens as the request asks), keeping for a prompt with media only
// the tokens that are vLLM's before the first media item. Those are the
// tokens of the whole prompt that agree with the tokens of the text before
// the media (in "openai" format the whole prompt is vLLM's; a media
// placeholder is a special token, so the two agree up to it). For a cut
// "string"-format prompt the last token is dropped too: the model's
// placeholder that follows it is not known and might merge with it.
func (p Prompt) Tokenize(encode func(string) ([]uint32, error)) (Tokens, error) {
	if p.MediaAt < 0 {
		ids, err := encode(p.Text)
		return Tokens{IDs: ids}, err
	}
	before, err := encode(p.Text[:p.MediaAt])
	if err != nil {
		return Tokens{}, err
	}
	if p.Cut {
		if len(before) > 0 {
			before = before[:len(before)-1]
		}
		return Tokens{IDs: before, Unscored: UnscoredMedia}, nil
	}
	full, err := encode(p.Text)
	if err != nil {
		return Tokens{}, err
	}
	n := 0
	for n < len(full) && n < len(before) && full[n] == before[n] {
		n++
	}
	return Tokens{IDs: full[:n], Unscored: UnscoredMedia}, nil
}
