package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"

	"github.com/kvindex/kvindex/indexer"
)

// scoreBody is the decoded POST /v1/score body. Slices are reused across
// requests through httpScratch.
type scoreBody struct {
	model, prompt, loraName, cacheSalt string
	sessionID                          string
	hasTokens, hasHashes, hasPrompt    bool
	tokens                             []uint32
	hashes                             []uint64
	pods                               []string
	// The chat input and a router's OpenAI body are handed on as JSON.
	messages, tools, documents, kwargs json.RawMessage
	effort, request                    json.RawMessage
	addGen, cont, addSpecial           optBool
}

// parseScoreBody is a strict decoder for the fixed shape of a score request.
// encoding/json spends ~0.4 us per token id through reflection, which for an
// 8k-token prompt costs more than hashing and lookup together; this walks the
// bytes once and writes ids straight into the reused buffers. Strings with
// escapes are handed to encoding/json so their semantics stay exact.
func parseScoreBody(data []byte, out *scoreBody) error {
	*out = scoreBody{tokens: out.tokens[:0], hashes: out.hashes[:0], pods: out.pods[:0]}
	s := scanner{b: data}
	if err := s.object(func(key string) error { return s.scoreField(key, out) }); err != nil {
		return err
	}
	return s.end()
}

// object reads {"key": value, ...}, calling field for each key with the
// scanner at its value (which field must consume).
func (s *scanner) object(field func(key string) error) error {
	s.ws()
	if !s.eat('{') {
		return s.errorf("expected a JSON object")
	}
	s.ws()
	if s.eat('}') {
		return nil
	}
	for {
		s.ws()
		key, err := s.key()
		if err != nil {
			return err
		}
		s.ws()
		if !s.eat(':') {
			return s.errorf("expected ':' after %q", key)
		}
		s.ws()
		if err := field(key); err != nil {
			return err
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat('}') {
			return nil
		}
		return s.errorf("expected ',' or '}'")
	}
}

// scoreField reads the value of one field of a score request; a pick
// request has the same fields plus its own.
func (s *scanner) scoreField(key string, out *scoreBody) error {
	var err error
	switch key {
	case "model":
		out.model, _, err = s.optStr(key)
	case "prompt":
		out.prompt, out.hasPrompt, err = s.optStr(key)
	case "lora_name":
		out.loraName, _, err = s.optStr(key)
	case "cache_salt":
		out.cacheSalt, _, err = s.optStr(key)
	case "session_id":
		out.sessionID, _, err = s.optStr(key)
	// A repeated key replaces the earlier value, as in encoding/json.
	case "token_ids":
		out.tokens = out.tokens[:0]
		err = s.array(key, func(i int) error {
			v, err := s.int(key, i)
			if err != nil {
				return err
			}
			if v < 0 || v > math.MaxUint32 {
				return fmt.Errorf("token_ids[%d] = %d is out of range [0, 2^32)", i, v)
			}
			out.tokens = append(out.tokens, uint32(v))
			return nil
		})
		out.hasTokens = len(out.tokens) > 0
	case "block_hashes":
		out.hashes = out.hashes[:0]
		err = s.array(key, func(i int) error {
			var h uint64
			var err error
			if s.peek() == '"' {
				var str string
				if str, err = s.str(); err == nil {
					h, err = parseHash(str)
				}
			} else {
				start := s.p
				s.number()
				h, err = parseHash(string(s.b[start:s.p]))
			}
			if err != nil {
				return fmt.Errorf("block_hashes[%d]: %v", i, err)
			}
			out.hashes = append(out.hashes, h)
			return nil
		})
		out.hasHashes = len(out.hashes) > 0
	case "pods":
		out.pods = out.pods[:0]
		err = s.array(key, func(i int) error {
			p, err := s.str()
			if err != nil {
				return fmt.Errorf("pods[%d]: %v", i, err)
			}
			out.pods = append(out.pods, p)
			return nil
		})
	case "messages":
		out.messages, err = s.raw(key)
	case "tools":
		out.tools, err = s.raw(key)
	case "documents":
		out.documents, err = s.raw(key)
	case "chat_template_kwargs":
		out.kwargs, err = s.raw(key)
	case "reasoning_effort":
		out.effort, err = s.raw(key)
	case "request":
		out.request, err = s.raw(key)
	case "add_generation_prompt":
		out.addGen, err = s.optBool(key)
	case "continue_final_message":
		out.cont, err = s.optBool(key)
	case "add_special_tokens":
		out.addSpecial, err = s.optBool(key)
	default:
		return fmt.Errorf("unknown field %q (want model, token_ids, block_hashes, prompt, messages, request, pods, lora_name, cache_salt, session_id, "+
			"tools, documents, add_generation_prompt, continue_final_message, chat_template_kwargs, reasoning_effort, add_special_tokens)", key)
	}
	return err
}

// knownKeys are the field names of score and pick requests: key returns
// these constants instead of allocating a string per field per request.
var knownKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"model", "prompt", "lora_name", "cache_salt", "session_id", "token_ids", "block_hashes", "pods",
		"messages", "tools", "documents", "chat_template_kwargs", "reasoning_effort", "request", "add_generation_prompt",
		"continue_final_message", "add_special_tokens",
		"policy", "candidates", "pod", "dp_rank", "waiting", "running", "kv_usage", "events"} {
		m[k] = k
	}
	return m
}()

// key reads an object key; known plain keys cost no allocation (the map
// lookup with a converted []byte does not allocate).
func (s *scanner) key() (string, error) {
	if s.eat('"') {
		start := s.p
		for s.p < len(s.b) && s.b[s.p] != '"' && s.b[s.p] != '\\' && s.b[s.p] >= 0x20 && s.b[s.p] < 0x80 {
			s.p++
		}
		if s.p < len(s.b) && s.b[s.p] == '"' {
			if k, ok := knownKeys[string(s.b[start:s.p])]; ok {
				s.p++
				return k, nil
			}
		}
		s.p = start - 1
	}
	return s.str()
}

type scanner struct {
	b []byte
	p int
}

func (s *scanner) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid JSON at byte %d: %s", s.p, fmt.Sprintf(format, args...))
}

func (s *scanner) ws() {
	for s.p < len(s.b) {
		switch s.b[s.p] {
		case ' ', '\t', '\n', '\r':
			s.p++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	if s.p < len(s.b) {
		return s.b[s.p]
	}
	return 0
}

func (s *scanner) eat(c byte) bool {
	if s.p < len(s.b) && s.b[s.p] == c {
		s.p++
		return true
	}
	return false
}

func (s *scanner) end() error {
	s.ws()
	if s.p != len(s.b) {
		return s.errorf("trailing data after the object")
	}
	return nil
}

func (s *scanner) null() bool {
	if len(s.b)-s.p >= 4 && string(s.b[s.p:s.p+4]) == "null" {
		s.p += 4
		return true
	}
	return false
}

// str reads a JSON string. Plain strings are sliced out; strings with
// escapes (or invalid bytes) go through encoding/json.
func (s *scanner) str() (string, error) {
	if !s.eat('"') {
		return "", s.errorf("expected a string")
	}
	start := s.p
	plain := true
	for s.p < len(s.b) {
		c := s.b[s.p]
		switch {
		case c == '"':
			s.p++
			if plain {
				return string(s.b[start : s.p-1]), nil
			}
			var v string
			if err := json.Unmarshal(s.b[start-1:s.p], &v); err != nil {
				return "", s.errorf("bad string: %v", err)
			}
			return v, nil
		case c == '\\':
			plain = false
			s.p += 2
			continue
		case c < 0x20:
			return "", s.errorf("control character in string")
		case c >= 0x80:
			plain = false
		}
		s.p++
	}
	return "", s.errorf("unterminated string")
}

// optStr reads a string or null (absent).
func (s *scanner) optStr(key string) (string, bool, error) {
	if s.null() {
		return "", false, nil
	}
	v, err := s.str()
	if err != nil {
		return "", false, fmt.Errorf("%s: %v", key, err)
	}
	return v, true, nil
}

// array reads null or [elem, ...], calling elem for each element.
func (s *scanner) array(key string, elem func(i int) error) error {
	if s.null() {
		return nil
	}
	if !s.eat('[') {
		return s.errorf("%s: expected an array", key)
	}
	s.ws()
	if s.eat(']') {
		return nil
	}
	for i := 0; ; i++ {
		// Checked while parsing: a 64 MB body must not first grow a
		// 32M-entry slice only for validate to refuse it.
		if i == indexer.MaxInputLen {
			return fmt.Errorf("%s has more than %d entries", key, indexer.MaxInputLen)
		}
		s.ws()
		if err := elem(i); err != nil {
			return err
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat(']') {
			return nil
		}
		return s.errorf("%s: expected ',' or ']'", key)
	}
}

// number skips a JSON number token.
func (s *scanner) number() {
	for s.p < len(s.b) {
		switch c := s.b[s.p]; {
		case c >= '0' && c <= '9', c == '-', c == '+', c == '.', c == 'e', c == 'E':
			s.p++
		default:
			return
		}
	}
}

// int reads an integer that must fit int64 (token ids are checked by the
// caller). Fractions and exponents are rejected.
func (s *scanner) int(key string, i int) (int64, error) {
	start := s.p
	neg := s.eat('-')
	var v uint64
	digits := 0
	for s.p < len(s.b) {
		c := s.b[s.p]
		if c < '0' || c > '9' {
			break
		}
		if v > (math.MaxInt64-9)/10 {
			s.number()
			return 0, fmt.Errorf("%s[%d] = %s is out of range [0, 2^32)", key, i, s.b[start:s.p])
		}
		v = v*10 + uint64(c-'0')
		digits++
		s.p++
	}
	if c := s.peek(); digits == 0 || c == '.' || c == 'e' || c == 'E' {
		s.number()
		return 0, fmt.Errorf("invalid JSON: %s[%d] = %q is not an integer", key, i, s.b[start:s.p])
	}
	if neg {
		return -int64(v), nil
	}
	return int64(v), nil
}

// raw reads any JSON value (null = absent) and returns a copy of its text.
func (s *scanner) raw(key string) (json.RawMessage, error) {
	if s.null() {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(s.b[s.p:]))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %v", key, err)
	}
	s.p += int(dec.InputOffset())
	return v, nil
}

// optBool reads true, false or null.
func (s *scanner) optBool(key string) (optBool, error) {
	switch {
	case s.null():
		return optBool{}, nil
	case bytes.HasPrefix(s.b[s.p:], []byte("true")):
		s.p += 4
		return optBool{set: true, v: true}, nil
	case bytes.HasPrefix(s.b[s.p:], []byte("false")):
		s.p += 5
		return optBool{set: true}, nil
	}
	return optBool{}, s.errorf("%s: expected true, false or null", key)
}

// optBool is a JSON boolean that may be absent or null.
type optBool struct{ set, v bool }

func (o optBool) ptr() *bool {
	if !o.set {
		return nil
	}
	v := o.v
	return &v
}
