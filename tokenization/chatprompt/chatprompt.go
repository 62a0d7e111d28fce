// Package chatprompt turns chat requests into the token ids vLLM computes for
// them, for scoring: the model's chat template (package chattemplate) renders
// the request, and the prefix store tokenizes the rendered text with
// add_special_tokens=false, so a growing conversation, which re-renders to a
// text extending its previous turn, does not re-tokenize that turn.
//
// Templates are loaded once per tokenizer directory (the directory the
// tokenization registry resolves the model name to, so both always read the
// same model) or per configured template file, and kept in a bounded cache.
package chatprompt

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/tokenization"
	"github.com/kvindex/kvindex/tokenization/chattemplate"
)

// Tokenizer tokenizes text for a model in both of vLLM's modes; the prefix
// store implements it.
type Tokenizer interface {
	// TokenizeRendered is add_special_tokens=false (vLLM's chat default).
	TokenizeRendered(ctx context.Context, model, text string) ([]uint32, error)
	// TokenizePrompt is add_special_tokens=true.
	TokenizePrompt(ctx context.Context, model, text string) ([]uint32, error)
}

// DefaultCapacity bounds the cached template sets (one per tokenizer
// directory and override file).
const DefaultCapacity = 256

// failedLoadRetry is how long a failed template load is remembered, so a
// broken template is not re-parsed on every request yet a fixed file is
// picked up without a restart.
const failedLoadRetry = 10 * time.Second

// Config wires a Renderer.
type Config struct {
	// Registry resolves model names to tokenizer directories (required; the
	// one the prefix store loads from).
	Registry *tokenization.Registry
	// Tokenizer tokenizes the rendered text (required).
	Tokenizer Tokenizer
	// Templates maps a model name to a chat template file that replaces the
	// model's own, like vLLM's --chat-template.
	Templates map[string]string
	// Capacity bounds the template cache (0 = DefaultCapacity).
	Capacity int
	// Registerer receives the metrics; nil = unregistered.
	Registerer prometheus.Registerer
}

// Renderer renders and tokenizes chat requests. Safe for concurrent use.
type Renderer struct {
	reg       *tokenization.Registry
	tok       Tokenizer
	overrides map[string]string
	capacity  int
	m         *metrics
	now       func() time.Time

	mu      sync.Mutex
	entries map[cacheKey]*entry
}

type cacheKey struct{ dir, file string }

type entry struct {
	done     chan struct{} // closed when the load finished
	t        *chattemplate.Templates
	err      error
	failedAt time.Time
}

// New returns a Renderer; templates are read on first use.
func New(cfg Config) (*Renderer, error) {
	if cfg.Registry == nil || cfg.Tokenizer == nil {
		return nil, errors.New("chatprompt: Registry and Tokenizer are required")
	}
	if cfg.Capacity <= 0 {
		cfg.Capacity = DefaultCapacity
	}
	overrides := make(map[string]string, len(cfg.Templates))
	for model, file := range cfg.Templates {
		overrides[model] = file
	}
	return &Renderer{reg: cfg.Registry, tok: cfg.Tokenizer, overrides: overrides, capacity: cfg.Capacity,
		m: newMetrics(cfg.Registerer), now: time.Now, entries: map[cacheKey]*entry{}}, nil
}

// TemplateError is a model whose chat template cannot be used: it has none,
// or it does not load (a template feature the engine does not support, an
// unreadable file). The request is valid; this daemon cannot answer it.
type TemplateError struct {
	Model string
	Err   error
}

func (e *TemplateError) Error() string {
	return fmt.Sprintf("chat template for model %q: %v", e.Model, e.Err)
}
func (e *TemplateError) Unwrap() error { return e.Err }

// Render returns the prompt vLLM renders for req. Errors are a
// *chattemplate.RequestError (the request's fault), a *TemplateError, or a
// tokenizer lookup error.
func (r *Renderer) Render(model string, req *chattemplate.Request) (chattemplate.Prompt, error) {
	t, err := r.templates(model)
	if err != nil {
		return chattemplate.Prompt{}, err
	}
	start := time.Now()
	prompt, err := t.Render(req)
	r.m.render.Observe(time.Since(start).Seconds())
	if err != nil {
		if errors.Is(err, chattemplate.ErrNoTemplate) || !isRequestError(err) {
			return chattemplate.Prompt{}, &TemplateError{Model: model, Err: err}
		}
		r.m.requestErrors.Inc()
		return chattemplate.Prompt{}, err
	}
	return prompt, nil
}

// TokenizeChat renders req and tokenizes the prompt as vLLM does for a chat
// request: add_special_tokens=false unless addSpecial (the request's
// add_special_tokens) is set. A prompt with media yields the tokens before
// its first media item (chattemplate.Prompt.Tokenize).
func (r *Renderer) TokenizeChat(ctx context.Context, model string, req *chattemplate.Request, addSpecial bool) (chattemplate.Tokens, error) {
	start := time.Now()
	prompt, err := r.Render(model, req)
	if err != nil {
		return chattemplate.Tokens{}, err
	}
	rendered := time.Since(start)
	tokens, err := prompt.Tokenize(func(text string) ([]uint32, error) {
		if addSpecial {
			return r.tok.TokenizePrompt(ctx, model, text)
		}
		return r.tok.TokenizeRendered(ctx, model, text)
	})
	tokens.Rendered = rendered
	return tokens, err
}

func isRequestError(err error) bool {
	var re *chattemplate.RequestError
	return errors.As(err, &re)
}

// templates returns the model's templates, loading them once per
// (directory, override file).
func (r *Renderer) templates(model string) (*chattemplate.Templates, error) {
	_, info, err := r.reg.GetInfo(model)
	if err != nil {
		return nil, err
	}
	key := cacheKey{dir: info.Dir, file: r.overrides[model]}
	if abs, err := filepath.Abs(key.dir); err == nil {
		key.dir = abs
	}
	r.mu.Lock()
	e, ok := r.entries[key]
	if ok {
		select {
		case <-e.done:
			if e.err != nil && r.now().Sub(e.failedAt) >= failedLoadRetry {
				ok = false
			}
		default:
		}
	}
	if !ok {
		e = &entry{done: make(chan struct{})}
		r.insert(key, e)
		r.mu.Unlock()
		t, err := chattemplate.LoadDir(info.Dir, key.file)
		r.mu.Lock()
		e.t, e.err = t, err
		if err != nil {
			e.failedAt = r.now()
			r.m.loadErrors.Inc()
		}
		close(e.done)
	}
	r.mu.Unlock()
	<-e.done
	if e.err != nil {
		return nil, &TemplateError{Model: model, Err: e.err}
	}
	return e.t, nil
}

// insert adds e under key, evicting another finished entry when the cache is
// full (the bound is on distinct directories and files, which requests can
// only choose among those on disk, so any victim will do). Caller holds mu.
func (r *Renderer) insert(key cacheKey, e *entry) {
	if _, replaced := r.entries[key]; !replaced && len(r.entries) >= r.capacity {
		for k, old := range r.entries {
			select {
			case <-old.done:
				delete(r.entries, k)
				r.m.evictions.Inc()
			default:
				continue // still loading: its waiters hold it anyway
			}
			break
		}
	}
	r.entries[key] = e
	r.m.cached.Set(float64(len(r.entries)))
}

// Cached is how many template sets are held.
func (r *Renderer) Cached() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}

type metrics struct {
	render        prometheus.Histogram
	requestErrors prometheus.Counter
	loadErrors    prometheus.Counter
	evictions     prometheus.Counter
	cached        prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		render: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvindexd_chat_render_seconds", Help: "Time to render a chat request with its template.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2.5, 12),
		}),
		requestErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_chat_render_request_errors_total", Help: "Chat requests refused while rendering (bad messages, raise_exception)."}),
		loadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_chat_template_load_errors_total", Help: "Chat template loads that failed (unsupported feature, unreadable file)."}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_chat_template_evictions_total", Help: "Template sets dropped at the cache bound."}),
		cached: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindexd_chat_templates_cached", Help: "Template sets (tokenizer directory, override file) held."}),
	}
	if reg != nil {
		reg.MustRegister(m.render, m.requestErrors, m.loadErrors, m.evictions, m.cached)
	}
	return m
}
