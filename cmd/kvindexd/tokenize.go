package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/kvindex/kvindex/tokenization"
)

func init() {
	subcommands["tokenize"] = subcommand{"encode JSON-lines texts with a tokenizer.json (debug token id mismatches)", runTokenize}
}

// runTokenize reads {"text": "..."} lines and writes {"ids": [...]} lines
// (with --boundaries also "boundaries": [[byte offset, ids before], ...]).
// A bad line is reported on stderr and answered with {"error": "..."} so
// output lines stay aligned with input lines; the exit status is non-zero
// at the end.
func runTokenize(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("kvindexd tokenize", flag.ContinueOnError)
	fl.SetOutput(stderr)
	path := fl.String("tokenizer", "", "directory with tokenizer.json[.gz] (+ tokenizer_config.json), or a tokenizer.json[.gz] file")
	addSpecial := fl.Bool("add-special-tokens", false, "add the post-processor's special tokens (BOS...), as vLLM does for /v1/completions")
	withBounds := fl.Bool("boundaries", false, "also print pre-tokenization boundaries [byte offset, ids before]")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "usage: kvindexd tokenize --tokenizer PATH [--add-special-tokens] [--boundaries] < lines.jsonl\n\n"+
			"Reads {\"text\": \"...\"} per line and writes {\"ids\": [...]} per line.\n\n")
		fl.PrintDefaults()
	}
	if err := parseFlags(fl, args, stdout); err != nil {
		return err
	}
	if *path == "" {
		return errors.New("--tokenizer is required")
	}
	tj, cj, err := tokenization.ReadTokenizerPath(*path)
	if err != nil {
		return err
	}
	tk, err := tokenization.Load(tj, cj)
	if err != nil {
		return fmt.Errorf("%s: %w", *path, err)
	}

	return runJSONLines("tokenize", stdin, stdout, stderr, func(raw, dst []byte) ([]byte, error) {
		var in struct {
			Text *string `json:"text"`
		}
		if err := decodeLine(raw, &in); err != nil {
			return dst, err
		}
		if in.Text == nil {
			return dst, errors.New(`missing "text"`)
		}
		var out struct {
			IDs        []uint32 `json:"ids"`
			Boundaries [][2]int `json:"boundaries,omitempty"`
		}
		var err error
		if *withBounds {
			var bs []tokenization.Boundary
			if out.IDs, bs, err = tk.EncodeBoundaries(*in.Text, *addSpecial); err != nil {
				return dst, err
			}
			out.Boundaries = make([][2]int, len(bs))
			for i, b := range bs {
				out.Boundaries[i] = [2]int{b.Offset, b.Tokens}
			}
		} else if out.IDs, err = tk.Encode(*in.Text, *addSpecial); err != nil {
			return dst, err
		}
		if out.IDs == nil {
			out.IDs = []uint32{}
		}
		enc, err := json.Marshal(out)
		return append(dst, enc...), err
	})
}
