package jinja

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// FromJSON decodes JSON into template values as Python's json.loads does:
// objects become *DictVal in document order (a repeated key keeps its first
// position and last value), arrays *ListVal, and a number without '.', 'e'
// or 'E' an int64, any other a float64. Integers beyond 64 bits and floats
// beyond float64 are refused rather than rounded (Python keeps them exact,
// so a rounded value would render differently). Invalid UTF-8 and lone
// surrogate escapes become U+FFFD (encoding/json's rule). Nesting is capped
// at maxJSONDepth so hostile input cannot exhaust the stack.
func FromJSON(data []byte) (any, error) {
	// encoding/json validates and unescapes; walking Decoder.Token rather
	// than unmarshalling into any keeps object key order and, with
	// UseNumber, the int/float distinction a map[string]any and float64
	// would lose.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := jsonValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, jsonError(dec, errors.New("trailing data after the JSON value"))
	}
	return v, nil
}

// maxJSONDepth bounds the nesting FromJSON accepts: the top-level value is
// at depth 0, the items of a container one deeper than it.
const maxJSONDepth = 1000

// jsonValue reads the value starting at the decoder's next token.
func jsonValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, jsonError(dec, fmt.Errorf("nested deeper than %d", maxJSONDepth))
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, jsonError(dec, err)
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			l := &ListVal{}
			for dec.More() {
				v, err := jsonValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				l.Items = append(l.Items, v)
			}
			return l, jsonEnd(dec)
		}
		obj := NewDict()
		for dec.More() {
			k, err := dec.Token() // a string: the decoder refuses anything else here
			if err != nil {
				return nil, jsonError(dec, err)
			}
			v, err := jsonValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			_ = obj.Set(k, v)
		}
		return obj, jsonEnd(dec)
	case json.Number:
		return jsonNumber(dec, string(t))
	}
	return tok, nil // string, bool or nil
}

// jsonEnd consumes the ']' or '}' that dec.More reported.
func jsonEnd(dec *json.Decoder) error {
	if _, err := dec.Token(); err != nil {
		return jsonError(dec, err)
	}
	return nil
}

// jsonNumber converts a number's text as Python's json module does.
func jsonNumber(dec *json.Decoder, text string) (any, error) {
	isFloat := strings.ContainsAny(text, ".eE")
	if !isFloat {
		if v, err := strconv.ParseInt(text, 10, 64); err == nil {
			return v, nil
		}
	}
	f, err := strconv.ParseFloat(text, 64)
	switch {
	case err != nil:
		return nil, jsonError(dec, fmt.Errorf("number %s out of range", text))
	case !isFloat:
		return nil, jsonError(dec, fmt.Errorf("integer %s does not fit in 64 bits", text))
	}
	return f, nil
}

func jsonError(dec *json.Decoder, err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		err = errors.New("unexpected end of input")
	}
	return fmt.Errorf("invalid JSON at offset %d: %w", dec.InputOffset(), err)
}
