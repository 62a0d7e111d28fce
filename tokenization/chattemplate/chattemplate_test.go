package chattemplate

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/tokenization/chattemplate/jinja"
)

func cfg(t *testing.T, v map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTemplateSelection(t *testing.T) {
	named := cfg(t, map[string]any{"chat_template": []map[string]string{
		{"name": "default", "template": "D"},
		{"name": "tool_use", "template": "T"},
		{"name": "rag", "template": "R"},
	}})
	tpl, err := Load(named, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tools, want string
	}{{"", "D"}, {"null", "D"}, {`[{"type": "function", "function": {"name": "f"}}]`, "T"}} {
		got, err := renderText(tpl, &Request{Messages: json.RawMessage(`[]`), Tools: json.RawMessage(c.tools)})
		if err != nil || got != c.want {
			t.Errorf("tools %q: got %q, %v; want %q", c.tools, got, err, c.want)
		}
	}
	// An empty tools list is a 400 in vLLM (check_tool_usage).
	var re *RequestError
	if _, err := renderText(tpl, &Request{Messages: json.RawMessage(`[]`), Tools: json.RawMessage(`[]`)}); !errors.As(err, &re) {
		t.Errorf("tools []: want a RequestError, got %v", err)
	}
	// A chat_template.jinja file wins over the config's templates.
	tpl, err = Load(named, []byte("F{{ bos_token }}"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := renderText(tpl, &Request{Messages: json.RawMessage(`[]`), Tools: json.RawMessage(`[{"function": {"name": "f"}}]`)}); err != nil || got != "F" {
		t.Errorf("file template: %q, %v", got, err)
	}
	noDefault := cfg(t, map[string]any{"chat_template": []map[string]string{{"name": "tool_use", "template": "T"}}})
	tpl, err = Load(noDefault, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := renderText(tpl, &Request{Messages: json.RawMessage(`[]`)}); err == nil {
		t.Error("no default template: no error")
	}
	tpl, err = Load(cfg(t, map[string]any{"bos_token": "<s>"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := renderText(tpl, &Request{Messages: json.RawMessage(`[]`)}); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("no template: %v", err)
	}
}

func TestSpecialTokens(t *testing.T) {
	c := cfg(t, map[string]any{
		"bos_token":                 map[string]any{"__type": "AddedToken", "content": "<B>", "lstrip": false},
		"eos_token":                 "<E>",
		"unk_token":                 nil,
		"additional_special_tokens": []any{"<x>", map[string]any{"content": "<y>"}},
		"chat_template":             "{{ bos_token }}{{ eos_token }}[{{ unk_token }}]{{ additional_special_tokens|join(',') }}",
	})
	tpl, err := Load(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := renderText(tpl, &Request{Messages: json.RawMessage(`[]`)})
	if err != nil || got != "<B><E>[]<x>,<y>" {
		t.Errorf("got %q, %v", got, err)
	}
	if _, err := Load(cfg(t, map[string]any{"bos_token": 5}), nil); err == nil {
		t.Error("numeric bos_token accepted")
	}
}

func TestKwargsAndOptions(t *testing.T) {
	src := "{{ add_generation_prompt }} {{ flag }} {{ documents|tojson }} {{ bos_token }}{{ reasoning_effort }}{{ enable_thinking }}"
	tpl, err := Load(cfg(t, map[string]any{"chat_template": src, "bos_token": "<s>"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	f := false
	for _, c := range []struct {
		req  Request
		want string
	}{
		{Request{}, "True  null <s>"},
		{Request{AddGenerationPrompt: &f}, "False  null <s>"},
		// The request's add_generation_prompt wins over the kwargs' (merge_kwargs).
		{Request{ChatTemplateKwargs: json.RawMessage(`{"flag": [1], "add_generation_prompt": false, "bos_token": "X"}`)}, "True [1] null X"},
		{Request{ChatTemplateKwargs: json.RawMessage(`{"tokenize": true}`)}, "True  null <s>"},
		{Request{ReasoningEffort: ptr("none")}, "True  null <s>noneFalse"},
		{Request{ReasoningEffort: ptr("low"), ChatTemplateKwargs: json.RawMessage(`{"enable_thinking": 0}`)}, "True  null <s>low0"},
		{Request{Documents: json.RawMessage(`[{"title": "t"}]`)}, `True  [{"title": "t"}] <s>`},
		{Request{ChatTemplateKwargs: json.RawMessage(`{"documents": [{}, {}], "max_length": 5, "padding": true}`)}, "True  [{}, {}] <s>"},
	} {
		c.req.Messages = json.RawMessage(`[{"role": "user", "content": "x"}]`)
		got, err := renderText(tpl, &c.req)
		if err != nil || got != c.want {
			t.Errorf("%+v: got %q, %v; want %q", c.req, got, err, c.want)
		}
	}
	for _, bad := range []Request{
		{ChatTemplateKwargs: json.RawMessage(`{"chat_template": "x"}`)},
		{ReasoningEffort: ptr("extreme")},
		{Documents: json.RawMessage(`[{"n": 1}]`)},
		{ChatTemplateKwargs: json.RawMessage(`{"messages": []}`)},
		{ChatTemplateKwargs: json.RawMessage(`[1]`)},
		{Documents: json.RawMessage(`{"a": 1}`)},
		{Documents: json.RawMessage(`["text"]`)},
		{Tools: json.RawMessage(`{"a": 1}`)},
		{ContinueFinalMessage: true},
	} {
		bad.Messages = json.RawMessage(`[{"role": "user", "content": "x"}]`)
		var re *RequestError
		if _, err := renderText(tpl, &bad); !errors.As(err, &re) {
			t.Errorf("%+v: want a RequestError, got %v", bad, err)
		}
	}
}

func TestBadMessages(t *testing.T) {
	tpl, err := Load(cfg(t, map[string]any{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{
		``, `null`, `{}`, `[1]`, `[{"content": "no role"}]`, `[{"role": 1}]`,
		`[{"role": "user", "content": 5}]`, `[{"role": "user", "content": [5]}]`,
		`[{"role": "user", "content": [{"type": "hologram"}]}]`, `[{"role": "user", "content": [{"text": "no type"}]}]`,
		`[{"role": "user", "content": [{"type": "prompt_embeds", "data": "AA"}]}]`,
		`[{"role": "user", "content": [{"type": "text", "text": 5}]}]`,
		`[{"role": "assistant", "tool_calls": {}}]`, `[{"role": "assistant", "tool_calls": [{"function": 1}]}]`,
		`[{"role": "user", "content": "x"}`, `[{"role": "user", "content": "x"}] trailing`,
	} {
		var re *RequestError
		if _, err := renderText(tpl, &Request{Messages: json.RawMessage(m)}); !errors.As(err, &re) {
			t.Errorf("%s: want a RequestError, got %v", m, err)
		}
	}
	// A text part without text and a refusal part are kept as vLLM keeps them.
	got, err := renderText(tpl, &Request{Messages: json.RawMessage(
		`[{"role": "user", "content": [{"type": "text"}, {"type": "refusal", "refusal": "no"}, "s"]}]`)})
	if err != nil || got != "no\ns" {
		t.Errorf("got %q, %v", got, err)
	}
}

// The expected formats are what vLLM's detection (reproduced on Jinja2's
// own syntax tree by hack/chat/gen_golden.py) gives for each template.
func TestContentFormatDetection(t *testing.T) {
	cases := readJSONL[struct {
		Template string `json:"template"`
		Format   string `json:"format"`
	}](t, "testdata/parity/format_cases.golden.jsonl")
	if len(cases) < 15 {
		t.Fatalf("%d cases", len(cases))
	}
	for _, c := range cases {
		tpl, err := Load(cfg(t, map[string]any{"chat_template": c.Template}), nil)
		if err != nil {
			// A template Jinja2 cannot parse is "string" for vLLM; ours fails to load.
			if c.Format != "string" {
				t.Errorf("%s: %v", c.Template, err)
			}
			continue
		}
		if got, _ := tpl.ContentFormat(false); string(got) != c.Format {
			t.Errorf("%s: %s, vLLM's rule gives %s", c.Template, got, c.Format)
		}
	}
}

func TestToolCallArguments(t *testing.T) {
	tpl, err := Load(cfg(t, map[string]any{"chat_template": "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments|tojson }};{% endfor %}{% endfor %}"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := `[{"role": "assistant", "content": null, "tool_calls": [
		{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [1.0, \"é\"]}"}},
		{"id": "2", "type": "function", "function": {"name": "f", "arguments": "not json"}},
		{"id": "5", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]}]`
	got, err := renderText(tpl, &Request{Messages: json.RawMessage(msgs)})
	want := `{"b": 1, "a": [1.0, "é"]};{};[1, 2];`
	if err != nil || got != want {
		t.Errorf("got %q, %v\nwant %q", got, err, want)
	}
	// The request model wants arguments as a JSON string: an object, null,
	// or a call without id or type is a 400 in vLLM.
	for _, call := range []string{
		`{"id": "4", "type": "function", "function": {"name": "f", "arguments": {"z": true}}}`,
		`{"id": "3", "type": "function", "function": {"name": "f", "arguments": null}}`,
		`{"type": "function", "function": {"name": "f", "arguments": "{}"}}`,
		`{"id": "6", "function": {"name": "f", "arguments": "{}"}}`,
	} {
		var re *RequestError
		if _, err := renderText(tpl, &Request{Messages: json.RawMessage(`[{"role": "assistant", "tool_calls": [` + call + `]}]`)}); !errors.As(err, &re) {
			t.Errorf("%s: want a RequestError, got %v", call, err)
		}
	}
}

func TestLoadErrorsAreNamed(t *testing.T) {
	for _, src := range []string{
		"{% include 'x.jinja' %}", "{{ x|batch(2) }}", "{{ x is sameas_unknown }}", "{{ 'a'.center(9) }}",
		"{% for x in y recursive %}{% endfor %}", "{{ cycler(1, 2) }}",
	} {
		_, err := Load(cfg(t, map[string]any{"chat_template": src}), nil)
		var ue *jinja.UnsupportedError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "unsupported template feature") {
			t.Errorf("%s: want UnsupportedError, got %v", src, err)
		}
	}
	if _, err := Load(cfg(t, map[string]any{"chat_template": "{% if %}"}), nil); err == nil {
		t.Error("syntax error accepted")
	}
	if _, err := Load([]byte("{bad json"), nil); err == nil {
		t.Error("bad config accepted")
	}
	if _, err := Load(cfg(t, map[string]any{"chat_template": 5}), nil); err == nil {
		t.Error("numeric chat_template accepted")
	}
}

func TestConcurrentRenders(t *testing.T) {
	tpl, err := LoadDir("testdata/templates/qwen3", "")
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{
		Messages:           json.RawMessage(`[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]`),
		Tools:              json.RawMessage(`[{"type": "function", "function": {"name": "f"}}]`),
		ChatTemplateKwargs: json.RawMessage(`{"enable_thinking": false}`),
	}
	want, err := renderText(tpl, req)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func() {
			for i := 0; i < 50; i++ {
				got, err := renderText(tpl, req)
				if err == nil && got != want {
					err = errors.New("concurrent render differs")
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for g := 0; g < 8; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func TestLoadDirGzipConfigAndOverride(t *testing.T) {
	dir := t.TempDir()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(cfg(t, map[string]any{"chat_template": "C{{ eos_token }}", "eos_token": "</s>"}))
	_ = zw.Close()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json.gz"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	tpl, err := LoadDir(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := renderText(tpl, &Request{Messages: json.RawMessage(`[]`)}); err != nil || got != "C</s>" {
		t.Errorf("gz config: %q, %v", got, err)
	}
	override := filepath.Join(dir, "o.jinja")
	_ = os.WriteFile(override, []byte("O{{ eos_token }}"), 0o644)
	if tpl, err = LoadDir(dir, override); err != nil {
		t.Fatal(err)
	}
	if got, err := renderText(tpl, &Request{Messages: json.RawMessage(`[]`)}); err != nil || got != "O</s>" {
		t.Errorf("override: %q, %v", got, err)
	}
	if _, err := LoadDir(dir, filepath.Join(dir, "missing.jinja")); err == nil {
		t.Error("missing override accepted")
	}
	if _, err := LoadDir(t.TempDir(), ""); err != nil {
		t.Errorf("empty dir: %v", err)
	}
}

// renderText is Render's prompt text, for tests of requests without media.
func renderText(tpl *Templates, req *Request) (string, error) {
	p, err := tpl.Render(req)
	return p.Text, err
}

func ptr[T any](v T) *T { return &v }
