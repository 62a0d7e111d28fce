package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const qwen3Dir = "../../tokenization/testdata/qwen3"

// TestRenderSubcommandMatchesReferences feeds every parity conversation
// through `kvindexd render` with the committed Qwen3 tokenizer and checks
// the prompt against Jinja2's render (hack/chat/gen_golden.py) and the ids
// against HF tokenizers' encoding of that render
// (hack/chat/gen-render-ids.mjs), or an error where Jinja2 failed.
func TestRenderSubcommandMatchesReferences(t *testing.T) {
	convs, err := os.ReadFile("../../tokenization/chattemplate/testdata/parity/conversations.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	type golden struct {
		Case   string  `json:"case"`
		Prompt *string `json:"prompt"`
		Media  bool    `json:"media"`
		IDs    []uint32
	}
	var want []golden
	readLines(t, "../../tokenization/chattemplate/testdata/parity/golden/qwen3.jsonl", func(b []byte) {
		var g golden
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatal(err)
		}
		want = append(want, g)
	})
	ids := map[string][]uint32{}
	// Renders with media: the text before the first media item, as the
	// reference gives it (Qwen3's template is "string" format).
	mediaPrefix := map[string]string{}
	readLines(t, "../../tokenization/chattemplate/testdata/parity/qwen3_ids.jsonl", func(b []byte) {
		var g struct {
			Case   string   `json:"case"`
			IDs    []uint32 `json:"ids"`
			Prompt *string  `json:"prompt"`
		}
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatal(err)
		}
		ids[g.Case] = g.IDs
		if g.Prompt != nil {
			mediaPrefix[g.Case] = *g.Prompt
		}
	})
	// The conversation lines carry a "name" the subcommand does not know.
	var in bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(convs))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		delete(m, "name")
		b, _ := json.Marshal(m)
		in.Write(append(b, '\n'))
	}
	var out, errb bytes.Buffer
	err = runRender([]string{"--tokenizer", qwen3Dir}, &in, &out, &errb)
	nErr := 0
	for _, g := range want {
		if g.Prompt == nil {
			nErr++
		}
	}
	if nErr == 0 && err != nil || nErr > 0 && (err == nil || !strings.Contains(err.Error(), "lines failed")) {
		t.Fatalf("run: %v (%d reference errors)\n%s", err, nErr, errb.String())
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d output lines for %d inputs", len(lines), len(want))
	}
	for i, g := range want {
		var got struct {
			Prompt   *string  `json:"prompt"`
			IDs      []uint32 `json:"ids"`
			Error    string   `json:"error"`
			Unscored string   `json:"unscored_reason"`
			MediaAt  *int     `json:"media_at"`
		}
		if err := json.Unmarshal([]byte(lines[i]), &got); err != nil {
			t.Fatalf("line %d: %v: %s", i+1, err, lines[i])
		}
		if g.Prompt == nil {
			if got.Error == "" {
				t.Errorf("%s: Jinja2 failed, render gave %s", g.Case, lines[i])
			}
			continue
		}
		if g.Media {
			prefix, ok := mediaPrefix[g.Case]
			if !ok || got.Prompt == nil || *got.Prompt != prefix || got.Unscored != "media" || got.MediaAt == nil || *got.MediaAt != len(prefix) {
				t.Errorf("%s: media: %s, want the prompt %q before the first media item", g.Case, lines[i], prefix)
				continue
			}
		} else if got.Prompt == nil || *got.Prompt != *g.Prompt {
			t.Errorf("%s: prompt %q, want %q (%s)", g.Case, deref(got.Prompt), *g.Prompt, got.Error)
			continue
		}
		if !equalIDs(got.IDs, ids[g.Case]) {
			t.Errorf("%s: ids differ from HF tokenizers\n got %v\nwant %v", g.Case, got.IDs, ids[g.Case])
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func readLines(t *testing.T, path string, fn func([]byte)) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		fn(sc.Bytes())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestRenderTemplateErrorsAndOverride(t *testing.T) {
	tmp := t.TempDir()
	override := filepath.Join(tmp, "t.jinja")
	if err := os.WriteFile(override, []byte(
		"{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}[{{ m.content }}]{% endfor %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	in := `{"messages": [{"role": "user", "content": "<|im_start|>"}]}
{"messages": [{"role": "bad", "content": "x"}]}
{"messages": "not a list"}
{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": true, "continue_final_message": true}
`
	var out, errb bytes.Buffer
	err := runRender([]string{"--tokenizer", qwen3Dir, "--chat-template", override}, strings.NewReader(in), &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "3 of 4 lines failed") {
		t.Fatalf("got %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("%q", out.String())
	}
	// The special token in the content is one id, as vLLM tokenizes it.
	if lines[0] != `{"prompt":"[<|im_start|>]","ids":[58,151644,60]}` {
		t.Errorf("line 1: %s", lines[0])
	}
	if !strings.Contains(lines[1], `no bad roles`) || !strings.Contains(lines[2], `"error"`) || !strings.Contains(lines[3], "cannot both be true") {
		t.Errorf("error lines: %q", lines[1:])
	}
}

func TestRenderFlags(t *testing.T) {
	if sc, ok := subcommands["render"]; !ok || sc.run == nil {
		t.Fatal("render not registered")
	}
	var out, errb bytes.Buffer
	if err := runRender(nil, strings.NewReader(""), &out, &errb); err == nil {
		t.Error("missing --tokenizer accepted")
	}
	if err := runRender([]string{"--tokenizer", qwen3Dir + "/tokenizer.json.gz"}, strings.NewReader(""), &out, &errb); err == nil {
		t.Error("a file accepted as --tokenizer")
	}
	if err := runRender([]string{"--tokenizer", qwen3Dir, "--chat-template", "/nonexistent.jinja"}, strings.NewReader(""), &out, &errb); err == nil {
		t.Error("missing --chat-template accepted")
	}
	bad := filepath.Join(t.TempDir(), "bad.jinja")
	_ = os.WriteFile(bad, []byte("{% include 'x' %}"), 0o644)
	err := runRender([]string{"--tokenizer", qwen3Dir, "--chat-template", bad}, strings.NewReader(""), &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "unsupported template feature") {
		t.Errorf("unsupported feature: %v", err)
	}
}

// TestRenderMediaPrefixGemma3 renders the parity conversations with media
// through `kvindexd render` with Gemma 3's tokenizer and template ("openai"
// format: the template renders the image itself, so the whole prompt is
// vLLM's) and checks the ids against HF tokenizers' encoding of Jinja2's
// render cut at the first <start_of_image> token, the token vLLM's Gemma 3
// processor replaces by the image (hack/chat/gen-render-ids.mjs). Skips
// without the fetched tokenizer (hack/tokenizers/setup.sh).
func TestRenderMediaPrefixGemma3(t *testing.T) {
	base := os.Getenv("KVINDEX_TOKENIZERS_DIR")
	if base == "" {
		base = filepath.Join("..", "..", ".cache", "tokenizers")
	}
	dir := filepath.Join(base, "gemma3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("KVINDEX_REQUIRE_ALL_TOKENIZERS") != "" {
			t.Fatalf("gemma3 tokenizer: %v", err)
		}
		t.Skipf("gemma3 tokenizer not fetched (hack/tokenizers/setup.sh): %v", err)
	}
	want := map[string][]uint32{}
	readLines(t, "../../tokenization/chattemplate/testdata/parity/gemma3_media_ids.jsonl", func(b []byte) {
		var g struct {
			Case       string   `json:"case"`
			IDs        []uint32 `json:"ids"`
			MediaToken bool     `json:"media_token"`
		}
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatal(err)
		}
		// A render without the image token (audio and video, which Gemma
		// 3's template drops) is one vLLM refuses: nothing to compare.
		if g.MediaToken {
			want[g.Case] = g.IDs
		}
	})
	if len(want) < 2 {
		t.Fatalf("%d reference renders with an image", len(want))
	}
	convs, err := os.ReadFile("../../tokenization/chattemplate/testdata/parity/conversations.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(convs)), "\n") {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		var name string
		_ = json.Unmarshal(m["name"], &name)
		if _, ok := want[name]; !ok {
			continue
		}
		delete(m, "name")
		b, _ := json.Marshal(m)
		in.Write(append(b, '\n'))
		names = append(names, name)
	}
	var out, errb bytes.Buffer
	if err := runRender([]string{"--tokenizer", dir}, &in, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for i, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		var got struct {
			IDs      []uint32 `json:"ids"`
			Unscored string   `json:"unscored_reason"`
		}
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatal(err)
		}
		if got.Unscored != "media" || !equalIDs(got.IDs, want[names[i]]) {
			t.Errorf("%s: %s\nwant ids %v", names[i], line, want[names[i]])
		}
	}
}
