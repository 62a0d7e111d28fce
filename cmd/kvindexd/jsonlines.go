package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// maxJSONLine bounds one input line of the JSON-lines subcommands (a
// 1M-token prompt is ~8 MB of JSON).
const maxJSONLine = 64 << 20

// runJSONLines is the loop shared by the debugging subcommands (blockhash,
// tokenize): each non-blank input line is answered by one output line,
// answer's JSON or {"error": "..."}, flushed at once for interactive use. A
// bad line is reported on stderr with its number and the run goes on, so
// output lines stay aligned with input lines; the returned error says how
// many lines failed.
func runJSONLines(name string, in io.Reader, out, stderr io.Writer, answer func(raw []byte, dst []byte) ([]byte, error)) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 1<<16), maxJSONLine)
	w := bufio.NewWriter(out)
	defer w.Flush()
	var buf []byte
	line, bad := 0, 0
	for sc.Scan() {
		line++
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		var err error
		if buf, err = answer(raw, buf[:0]); err != nil {
			bad++
			fmt.Fprintf(stderr, "kvindexd %s: line %d: %v\n", name, line, err)
			msg, _ := json.Marshal(err.Error())
			buf = append(append(append(buf[:0], `{"error":`...), msg...), '}')
		}
		buf = append(buf, '\n')
		if _, err := w.Write(buf); err != nil {
			return err
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("line %d: %w", line+1, err)
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d lines failed", bad, line)
	}
	return nil
}

// decodeLine decodes one JSON object strictly: unknown fields and trailing
// data are errors, so a typo in a field name is not silently ignored.
func decodeLine(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}
