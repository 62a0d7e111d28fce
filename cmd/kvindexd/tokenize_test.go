package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// Expected ids are HF tokenizers' (Rust, npm tokenizers@0.23.2) for Qwen3, as
// in tokenization/testdata/golden/qwen3.jsonl.gz.
func TestTokenizeSubcommand(t *testing.T) {
	if _, ok := subcommands["tokenize"]; !ok {
		t.Fatal("tokenize not registered")
	}
	in := `{"text": " "}
{"text": "\n"}
not json
{"text": ""}
{"text": "<|im_start|>"}
{"nottext": 1}
`
	var out, errb bytes.Buffer
	err := runTokenize([]string{"--tokenizer", "../../tokenization/testdata/qwen3"}, strings.NewReader(in), &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "2 of 6 lines failed") {
		t.Fatalf("want error about 2 bad lines, got %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{`{"ids":[220]}`, `{"ids":[198]}`, `{"error":`, `{"ids":[]}`, `{"ids":[151644]}`, `{"error":`}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines: %q", len(lines), out.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d = %s, want prefix %s", i+1, lines[i], w)
		}
	}
	if !strings.Contains(errb.String(), "line 3:") || !strings.Contains(errb.String(), "line 6:") {
		t.Errorf("stderr lacks line numbers: %s", errb.String())
	}
}

func TestTokenizeFileAndBoundaries(t *testing.T) {
	var out, errb bytes.Buffer
	err := runTokenize([]string{"--tokenizer", "../../tokenization/testdata/qwen3/tokenizer.json.gz", "--boundaries"},
		strings.NewReader(`{"text": "  \n"}`+"\n"), &out, &errb)
	if err != nil {
		t.Fatal(err, errb.String())
	}
	var got struct {
		IDs        []uint32 `json:"ids"`
		Boundaries [][2]int `json:"boundaries"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	// HF tokenizers 0.23.2 (Rust) encodes "  \n" with Qwen3 as [2303]: one
	// pre-token, so the only boundary is the end of the text.
	if len(got.IDs) != 1 || got.IDs[0] != 2303 || len(got.Boundaries) != 1 || got.Boundaries[0] != [2]int{3, 1} {
		t.Fatalf("got %+v", got)
	}
}

func TestTokenizeErrors(t *testing.T) {
	var out, errb bytes.Buffer
	if err := runTokenize(nil, strings.NewReader(""), &out, &errb); err == nil {
		t.Fatal("missing --tokenizer accepted")
	}
	if err := runTokenize([]string{"--tokenizer", "/nonexistent"}, strings.NewReader(""), &out, &errb); err == nil {
		t.Fatal("missing path accepted")
	}
}
