package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
)

func init() {
	subcommands["blockhash"] = subcommand{"print vLLM block hashes of JSON-lines token ids (debug key mismatches)", runBlockhash}
}

type blockhashInput struct {
	TokenIDs  *[]uint32 `json:"token_ids"`
	LoraName  string    `json:"lora_name"`
	CacheSalt string    `json:"cache_salt"`
}

// runBlockhash reads {"token_ids": [...], "lora_name": "...", "cache_salt": "..."}
// lines and writes {"block_hashes": [...]} lines: the 64-bit keys vLLM
// publishes for every full block, computed exactly as the indexer does. A bad
// line is reported on stderr with its line number and answered with
// {"error": "..."} on stdout (so output lines stay aligned with input lines);
// the run continues and the exit status is non-zero at the end.
func runBlockhash(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvindexd blockhash", flag.ContinueOnError)
	fs.SetOutput(stderr)
	algo := fs.String("algo", string(blockkeys.AlgoSHA256), "hash algorithm, as vLLM's --prefix-caching-hash-algo: "+blockkeys.HashAlgoNames())
	seed := fs.String("seed", "", "the engine's PYTHONHASHSEED string (required; vLLM hashes it as a str)")
	blockSize := fs.Int("block-size", int(indexer.Options.BlockSize.Default), "the engine's --block-size (tokens per block)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kvindexd blockhash --algo A --seed S --block-size N < lines.jsonl\n\n"+
			"Reads {\"token_ids\": [...], \"lora_name\": \"...\", \"cache_salt\": \"...\"} per line (last two optional)\n"+
			"and writes {\"block_hashes\": [uint64, ...]} per line.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	seedSet := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "seed" {
			seedSet = true
		}
	})
	if !seedSet {
		return errors.New("--seed is required: pass the engine's PYTHONHASHSEED (an engine without it hashes with a random seed no one can reproduce)")
	}
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.HashAlgo(*algo), Seed: *seed, BlockSize: *blockSize})
	if err != nil {
		return err
	}

	var keys []blockkeys.Key
	return runJSONLines("blockhash", stdin, stdout, stderr, func(raw, out []byte) ([]byte, error) {
		var in blockhashInput
		if err := decodeLine(raw, &in); err != nil {
			return out, err
		}
		if in.TokenIDs == nil {
			return out, errors.New(`missing "token_ids"`)
		}
		keys = h.Keys(keys[:0], *in.TokenIDs, blockkeys.RequestExtras{LoraName: in.LoraName, CacheSalt: in.CacheSalt})
		out = append(out, `{"block_hashes":[`...)
		for i, k := range keys {
			if i > 0 {
				out = append(out, ',')
			}
			out = strconv.AppendUint(out, uint64(k), 10)
		}
		return append(out, "]}"...), nil
	})
}
