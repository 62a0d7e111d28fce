// Package sim replays Mooncake-format request traces against block caches
// (`kvsim replay`) and simulates a fleet of engines behind a router
// (`kvsim simulate`), so routing policies can be compared on real traffic;
// `kvsim simulate --scenario` runs a vLLM engine model (KV blocks,
// continuous batching, chunked prefill, preemption) behind llm-d-style
// scheduler profiles on a staged load. See docs/simulator.md for the models and
// every policy's parameters.
package sim

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// Request is one line of a Mooncake FAST'25 trace.
type Request struct {
	Timestamp    int64    `json:"timestamp"` // arrival, milliseconds
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
	// OutputHashIDs are the ids of the full blocks the answer completes
	// (continuing HashIDs' chain), so that a pod that decoded the request
	// caches them, as vLLM caches the full blocks of generated tokens. The
	// Mooncake traces do not carry it; the generated multi-turn workload
	// does (its next turn starts with them).
	OutputHashIDs []uint64 `json:"output_hash_ids,omitempty"`
	// prev is 1 + the index in the trace of the previous turn of the same
	// conversation (0: none or unknown); only GenMultiTurn sets it.
	prev int
}

// ReadTrace parses JSONL (plain or gzip, detected by its magic bytes). Blank
// lines are skipped; a malformed line is an error naming the line.
func ReadTrace(r io.Reader) ([]Request, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("trace: gzip: %w", err)
		}
		defer zr.Close()
		br = bufio.NewReaderSize(zr, 1<<16)
	}
	var out []Request
	line := 0
	for {
		b, err := br.ReadBytes('\n')
		if len(b) > 0 {
			line++
			if t := bytes.TrimSpace(b); len(t) > 0 {
				var q Request
				if jerr := json.Unmarshal(t, &q); jerr != nil {
					return nil, fmt.Errorf("trace: line %d: %w", line, jerr)
				}
				if q.InputLength < 0 || q.OutputLength < 0 {
					return nil, fmt.Errorf("trace: line %d: negative length", line)
				}
				out = append(out, q)
			}
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("trace: line %d: %w", line+1, err)
		}
	}
}

// ReadTraceFile opens path (plain or .gz) and parses it.
func ReadTraceFile(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadTrace(f)
}

// WriteTrace writes requests as Mooncake JSONL.
func WriteTrace(w io.Writer, reqs []Request) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range reqs {
		if reqs[i].HashIDs == nil {
			reqs[i].HashIDs = []uint64{}
		}
		if err := enc.Encode(&reqs[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}
