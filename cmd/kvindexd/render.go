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

// runRender reads chat requests and writes {"prompt": ..., "ids": [...]}
// per line: the text vLLM's chat endpoint renders and its token ids
// (add_special_tokens=false, as vLLM tokenizes a rendered chat). A bad line
// or a template error (raise_exception) is answered with {"error": "..."}.
func runRender(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("kvindexd render", flag.ContinueOnError)
	fl.SetOutput(stderr)
	dir := fl.String("tokenizer", "", "model directory with tokenizer.json[.gz] and tokenizer_config.json (and chat_template.jinja if the model has one)")
	templateFile := fl.String("chat-template", "", "Jinja2 chat template file to use instead of the model's (like vLLM's --chat-template)")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "usage: kvindexd render --tokenizer DIR [--chat-template FILE] < requests.jsonl\n\n"+
			"Reads {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true, \"continue_final_message\": false,\n"+
			"\"chat_template_kwargs\": {...}} per line (all but messages optional) and writes {\"prompt\": \"...\", \"ids\": [...]}.\n\n")
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
		ids, err := tk.Encode(prompt, false)
		if err != nil {
			return dst, err
		}
		if ids == nil {
			ids = []uint32{}
		}
		buf := bytes.NewBuffer(dst)
		enc := json.NewEncoder(buf)
		enc.SetEscapeHTML(false) // keep "<|im_start|>" readable
		if err := enc.Encode(struct {
			Prompt string   `json:"prompt"`
			IDs    []uint32 `json:"ids"`
		}{prompt, ids}); err != nil {
			return dst, err
		}
		return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
	})
}
