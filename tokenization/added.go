package tokenization

import "unicode/utf8"

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// tokenTrie finds added tokens with leftmost-longest semantics (what HF's
// aho-corasick MatchKind::LeftmostLongest gives): the earliest starting
// match, the longest one at that start, then scanning resumes after it.
type tokenTrie struct {
	first   [256]bool // bytes a token can start with (fast skip)
	inToken [256]bool // bytes that occur in some token (see scanStart)
	nodes   []trieNode
	toks    []*addedToken
	empty   bool
	// encodeSpecial is HF's encode_special_tokens (transformers'
	// split_special_tokens): special tokens are not extracted.
	encodeSpecial bool
}

type trieNode struct {
	keys  []byte
	kids  []int32
	token int32 // index into toks, -1 if none
}

func newTokenTrie(toks []*addedToken, content func(*addedToken) string) *tokenTrie {
	t := &tokenTrie{nodes: []trieNode{{token: -1}}, empty: true}
	for _, tok := range toks {
		c := content(tok)
		if c == "" {
			continue
		}
		t.empty = false
		t.first[c[0]] = true
		n := int32(0)
		for i := 0; i < len(c); i++ {
			t.inToken[c[i]] = true
			n = t.child(n, c[i], true)
		}
		if t.nodes[n].token < 0 {
			t.nodes[n].token = int32(len(t.toks))
			t.toks = append(t.toks, tok)
		}
	}
	return t
}

func (t *tokenTrie) child(n int32, b byte, create bool) int32 {
	nd := &t.nodes[n]
	for i, k := range nd.keys {
		if k == b {
			return nd.kids[i]
		}
	}
	if !create {
		return -1
	}
	id := int32(len(t.nodes))
	t.nodes = append(t.nodes, trieNode{token: -1})
	nd = &t.nodes[n]
	nd.keys = append(nd.keys, b)
	nd.kids = append(nd.kids, id)
	return id
}

// longestAt returns the token index and end of the longest token starting at i.
func (t *tokenTrie) longestAt(s string, i int) (int32, int) {
	n := int32(0)
	best, bestEnd := int32(-1), -1
	for j := i; j < len(s); j++ {
		n = t.child(n, s[j], false)
		if n < 0 {
			break
		}
		if tk := t.nodes[n].token; tk >= 0 {
			best, bestEnd = tk, j+1
		}
	}
	return best, bestEnd
}

// scanStart returns an offset w such that the splits of s[w:end] end like the
// splits of s[:end] (the last one is a token, or text starting at the same
// place when it is not the only one), so a continuation at end need not
// rescan the whole prefix. Matches are found left to right and a byte that
// occurs in no token cannot be inside one, so after such a byte the scan
// restarts exactly as the full scan goes on. The whitespace run before end is
// skipped first: an rstrip token absorbs it. single_word looks at the
// character before a match, which may lie before w, so it rescans from 0.
func (t *tokenTrie) scanStart(s string, end int, singleWord bool) int {
	if singleWord {
		return 0
	}
	i := end
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !isRustWhitespace(r) {
			break
		}
		i -= n
	}
	for i > 0 && t.inToken[s[i-1]] {
		i--
	}
	return i
}

// addedSplit is a piece of a sequence: an added token (tok != nil) or text.
type addedSplit struct {
	start, end int
	tok        *addedToken
}

// split cuts s at added tokens exactly like HF AddedVocabulary::find_matches
// (single_word filtering, lstrip/rstrip whitespace absorption).
func (t *tokenTrie) split(s string, dst []addedSplit) []addedSplit {
	if t == nil || t.empty {
		if s != "" {
			dst = append(dst, addedSplit{0, len(s), nil})
		}
		return dst
	}
	startOff := 0
	for i := 0; i < len(s); {
		if !t.first[s[i]] {
			i++
			continue
		}
		ti, end := t.longestAt(s, i)
		if ti < 0 {
			i++
			continue
		}
		tok := t.toks[ti]
		start, stop := i, end
		i = end // the automaton resumes after the raw match
		if t.encodeSpecial && tok.Special {
			continue
		}
		if tok.SingleWord {
			startSpace := start == 0 || !isWordChar(lastRune(s[:start]))
			stopSpace := stop == len(s) || !isWordChar(firstRune(s[stop:]))
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tok.LStrip {
			ns := start
			for ns > 0 {
				r, sz := utf8.DecodeLastRuneInString(s[:ns])
				if !isRustWhitespace(r) {
					break
				}
				ns -= sz
			}
			start = max(ns, startOff)
		}
		if tok.RStrip {
			for stop < len(s) {
				r, sz := utf8.DecodeRuneInString(s[stop:])
				if !isRustWhitespace(r) {
					break
				}
				stop += sz
			}
		}
		if startOff < start {
			dst = append(dst, addedSplit{startOff, start, nil})
		}
		dst = append(dst, addedSplit{start, stop, tok})
		startOff = stop
	}
	if startOff < len(s) {
		dst = append(dst, addedSplit{startOff, len(s), nil})
	}
	return dst
}

func hasSingleWord(toks []*addedToken) bool {
	for _, t := range toks {
		if t.SingleWord {
			return true
		}
	}
	return false
}
