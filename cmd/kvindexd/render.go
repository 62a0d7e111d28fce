package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kvindex/kvindex/tokenization"
	"github.com/kvindex/kvindex/tokenization/chattemplate"
)

func init() {
	subcommands["render"] = subcommand{"render JSON-lines chat requests with the model's chat template and tokenize them", runRender}
}

// renderLine is one answer of kvindexd render.
type renderLine struct {
	// Prompt is the text vLLM's chat endpoint renders (with media in a
	// "string"-format template, up to the first media item only).
	Prompt string `json:"prompt"`
	// IDs are its token ids as far as they are vLLM's: for a request with
	// media, the tokens before the first media item.
	IDs []uint32 `json:"ids"`
	// MediaAt is the byte offset of the first media item in Prompt.
	MediaAt *int `json:"media_at,omitempty"`
	// UnscoredReason is "media" when IDs stop at a media item.
	UnscoredReason string `json:"unscored_reason,omitempty"`
}

// runRender reads chat requests and writes {"prompt": ..., "ids": [...]}
// per line: the text vLLM's chat endpoint renders and its token ids
// (add_special_tokens=false, as vLLM tokenizes a rendered chat); a request
// with image, audio or video parts also gets "media_at" and
// "unscored_reason": "media", its ids stopping before the first media item.
// A bad line or a template error (raise_exception) is answered with
// {"error": "..."}.
func runRender(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("kvindexd render", flag.ContinueOnError)
	fl.SetOutput(stderr)
	dir := fl.String("tokenizer", "", "model directory with tokenizer.json[.gz] and tokenizer_config.json (and chat_template.jinja if the model has one)")
	templateFile := fl.String("chat-template", "", "Jinja2 chat template file to use instead of the model's (like vLLM's --chat-template)")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "usage: kvindexd render --tokenizer DIR [--chat-template FILE] < requests.jsonl\n\n"+
			"Reads {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true, \"continue_final_message\": false,\n"+
			"\"chat_template_kwargs\": {...}, \"reasoning_effort\": \"...\"} per line (all but messages optional) and writes {\"prompt\": \"...\", \"ids\": [...]}\n"+
			"(with media parts also \"media_at\" and \"unscored_reason\": \"media\", ids stopping before the first media item).\n\n")
		fl.PrintDefaults()
	}
	if err := parseFlags(fl, args, stdout); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("--tokenizer is required")
	}
	if st, err := os.Stat(*dir); err != nil {
		return err
	} else if !st.IsDir() {
		return fmt.Errorf("--tokenizer %s: want the model directory", *dir)
	}
	tk, err := tokenization.LoadDir(*dir)
	if err != nil {
		return err
	}
	tpl, err := chattemplate.LoadDir(*dir, *templateFile)
	if err != nil {
		return fmt.Errorf("chat template: %w", err)
	}
	return runJSONLines("render", stdin, stdout, stderr, func(raw, dst []byte) ([]byte, error) {
		var req chattemplate.Request
		if err := decodeLine(raw, &req); err != nil {
			return dst, err
		}
		prompt, err := tpl.Render(&req)
		if err != nil {
			return dst, err
		}
		toks, err := prompt.Tokenize(func(text string) ([]uint32, error) { return tk.Encode(text, false) })
		if err != nil {
			return dst, err
		}
		if toks.IDs == nil {
			toks.IDs = []uint32{}
		}
		out := renderLine{Prompt: prompt.Text, IDs: toks.IDs, UnscoredReason: toks.Unscored}
		if prompt.MediaAt >= 0 {
			out.MediaAt = &prompt.MediaAt
		}
		buf := bytes.NewBuffer(dst)
		enc := json.NewEncoder(buf)
		enc.SetEscapeHTML(false) // keep "<|im_start|>" readable
		if err := enc.Encode(out); err != nil {
			return dst, err
		}
		return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
	})
}
