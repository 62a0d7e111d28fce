package tokenization

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// piece is a pre-tokenization split.
type piece struct {
	text   string
	pos    int  // normalized offset of text[pre:] (or of the piece start if pre covers it)
	pre    int  // leading bytes of text that were synthesized (prefix space / ▁)
	linear bool // text[pre:] is exactly the normalized text at pos
	safe   bool // a continuation may start at this piece's start
	inner  bool // a continuation may start at a later split strictly inside this piece
	first  bool // piece starts its pre-tokenization input (no earlier split before it)
}

// sub returns the sub-piece text[a:b] created by a split of a stage;
// match tells whether it contains (part of) a pattern match, local whether
// the stage's pattern is position independent.
func (p piece) sub(a, b int, match, local bool) piece {
	q := piece{text: p.text[a:b], linear: p.linear}
	if a < p.pre {
		q.pos, q.pre = p.pos, p.pre-a
		if q.pre > len(q.text) {
			q.pre = len(q.text)
		}
	} else {
		q.pos = p.pos + a - p.pre
	}
	if a == 0 {
		q.safe, q.first = p.safe, p.first
	} else {
		q.safe = p.inner && local && p.linear && a >= p.pre
	}
	q.inner = p.inner && local && !match
	return q
}

type ptCtx struct {
	cont        bool // the input is a continuation (EncodeSuffix mid-piece)
	atTextStart bool // the input starts at original offset 0
	spans       []span
	marks       []mark
}

type mark struct {
	start, end int
	match      bool
	remove     bool
}

type preTokenizer interface {
	split(dst []piece, p piece, c *ptCtx) ([]piece, error)
}

type preTokJSON struct {
	Type           string            `json:"type"`
	Pretokenizers  []json.RawMessage `json:"pretokenizers"`
	Pattern        patternJSON       `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Replacement    string            `json:"replacement"`
	PrependScheme  string            `json:"prepend_scheme"`
	Split          *bool             `json:"split"`
	Individual     bool              `json:"individual_digits"`
}

// parsePreTokenizer returns the stages in order (Sequence flattened).
func parsePreTokenizer(raw json.RawMessage) ([]preTokenizer, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var j preTokJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	switch j.Type {
	case "Sequence":
		var out []preTokenizer
		for _, r := range j.Pretokenizers {
			s, err := parsePreTokenizer(r)
			if err != nil {
				return nil, err
			}
			out = append(out, s...)
		}
		return out, nil
	case "Split":
		m, err := compilePattern(j.Pattern)
		if err != nil {
			return nil, fmt.Errorf("pre_tokenizer Split: %w", err)
		}
		b, err := parseBehavior(j.Behavior)
		if err != nil {
			return nil, err
		}
		return []preTokenizer{&splitPT{m: m, behavior: b, invert: j.Invert}}, nil
	case "ByteLevel":
		bl := &byteLevelPT{addPrefixSpace: true, useRegex: true}
		if j.AddPrefixSpace != nil {
			bl.addPrefixSpace = *j.AddPrefixSpace
		}
		if j.UseRegex != nil {
			bl.useRegex = *j.UseRegex
		}
		if bl.useRegex {
			m, err := compilePattern(patternJSON{Regex: &gpt2Pattern})
			if err != nil {
				return nil, err
			}
			bl.re = m
		}
		return []preTokenizer{bl}, nil
	case "Metaspace":
		ms := &metaspacePT{replacement: '▁', scheme: "always", doSplit: true}
		if j.Replacement != "" {
			r, n := utf8.DecodeRuneInString(j.Replacement)
			if n != len(j.Replacement) {
				return nil, fmt.Errorf("metaspace pre-tokenizer: replacement %q is not one character", j.Replacement)
			}
			ms.replacement = r
		}
		switch {
		case j.PrependScheme != "":
			ms.scheme = j.PrependScheme
		case j.AddPrefixSpace != nil && !*j.AddPrefixSpace:
			ms.scheme = "never"
		}
		if ms.scheme != "always" && ms.scheme != "first" && ms.scheme != "never" {
			return nil, fmt.Errorf("metaspace pre-tokenizer: prepend_scheme %q unsupported", ms.scheme)
		}
		if j.Split != nil {
			ms.doSplit = *j.Split
		}
		return []preTokenizer{ms}, nil
	case "Digits":
		return []preTokenizer{digitsPT{individual: j.Individual}}, nil
	}
	return nil, fmt.Errorf("unsupported pre_tokenizer %q", j.Type)
}

var gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

type behavior int

const (
	bIsolated behavior = iota
	bRemoved
	bMergedWithPrevious
	bMergedWithNext
	bContiguous
)

func parseBehavior(s string) (behavior, error) {
	switch s {
	case "Isolated":
		return bIsolated, nil
	case "Removed":
		return bRemoved, nil
	case "MergedWithPrevious":
		return bMergedWithPrevious, nil
	case "MergedWithNext":
		return bMergedWithNext, nil
	case "Contiguous":
		return bContiguous, nil
	}
	return 0, fmt.Errorf("unsupported Split behavior %q", s)
}

// applyBehavior turns the spans of pattern matches in p.text into pieces,
// exactly as NormalizedString::split does.
func applyBehavior(dst []piece, p piece, matches []span, bh behavior, invert, local bool, c *ptCtx) []piece {
	// find_matches: alternate unmatched / matched ranges covering the text
	mk := c.marks[:0]
	prev := 0
	for _, m := range matches {
		if prev != m.start {
			mk = append(mk, mark{prev, m.start, invert, false})
		}
		mk = append(mk, mark{m.start, m.end, !invert, false})
		prev = m.end
	}
	if prev != len(p.text) {
		mk = append(mk, mark{prev, len(p.text), invert, false})
	}
	var out []mark
	switch bh {
	case bIsolated:
		out = mk
	case bRemoved:
		for i := range mk {
			mk[i].remove = mk[i].match
		}
		out = mk
	case bContiguous:
		out = mk[:0:0]
		for i, m := range mk {
			if i > 0 && mk[i-1].match == m.match && len(out) > 0 {
				out[len(out)-1].end = m.end
				continue
			}
			out = append(out, m)
		}
	case bMergedWithPrevious:
		out = mk[:0:0]
		prevMatch := false
		for _, m := range mk {
			if m.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = m.end
				out[len(out)-1].match = true
			} else {
				out = append(out, m)
			}
			prevMatch = m.match
		}
	case bMergedWithNext:
		out = make([]mark, 0, len(mk))
		prevMatch := false
		for i := len(mk) - 1; i >= 0; i-- {
			m := mk[i]
			if m.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = m.start
				out[len(out)-1].match = true
			} else {
				out = append(out, m)
			}
			prevMatch = m.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	}
	for _, m := range out {
		if m.remove || m.start == m.end {
			continue
		}
		dst = append(dst, p.sub(m.start, m.end, m.match, local))
	}
	c.marks = mk[:0]
	return dst
}

type splitPT struct {
	m        matcher
	behavior behavior
	invert   bool
}

func (s *splitPT) split(dst []piece, p piece, c *ptCtx) ([]piece, error) {
	var err error
	c.spans, err = s.m.findAll(p.text, c.spans[:0])
	if err != nil {
		return dst, err
	}
	return applyBehavior(dst, p, c.spans, s.behavior, s.invert, s.m.local(), c), nil
}

// byteLevelPT is HF's ByteLevel pre-tokenizer. With raw set (it is the last
// stage and the model is keyed by raw bytes) the byte-to-unicode mapping is
// folded into the model; otherwise the text is mapped here.
type byteLevelPT struct {
	addPrefixSpace bool
	useRegex       bool
	re             matcher
	raw            bool
}

func (b *byteLevelPT) split(dst []piece, p piece, c *ptCtx) ([]piece, error) {
	if b.addPrefixSpace && !strings.HasPrefix(p.text, " ") && (!p.first || !c.cont) {
		p.text = " " + p.text
		p.pre++
		if !p.first {
			// a continuation starting here would not get the space
			p.safe = false
		}
	}
	start := len(dst)
	if b.useRegex {
		var err error
		c.spans, err = b.re.findAll(p.text, c.spans[:0])
		if err != nil {
			return dst, err
		}
		dst = applyBehavior(dst, p, c.spans, bIsolated, false, true, c)
	} else if p.text != "" {
		dst = append(dst, p)
	}
	if !b.raw {
		for i := start; i < len(dst); i++ {
			var sb strings.Builder
			sb.Grow(len(dst[i].text) * 2)
			for k := 0; k < len(dst[i].text); k++ {
				sb.WriteRune(byteLevelChars[dst[i].text[k]])
			}
			dst[i].text = sb.String()
			dst[i].linear = false
			dst[i].inner = false
		}
	}
	return dst, nil
}

// metaspacePT is HF's Metaspace pre-tokenizer: spaces become the
// replacement char, a prefix is prepended per prepend_scheme, and with split
// the text is cut before every replacement char.
type metaspacePT struct {
	replacement rune
	scheme      string
	doSplit     bool
}

func (ms *metaspacePT) split(dst []piece, p piece, c *ptCtx) ([]piece, error) {
	rep := string(ms.replacement)
	var sb strings.Builder
	sb.Grow(len(p.text) + 8)
	// starts of output pieces: output offset + input offset
	type cut struct{ out, in int }
	var cuts []cut
	prefix := false
	switch ms.scheme {
	case "always":
		prefix = !p.first || !c.cont
	case "first":
		prefix = p.first && !c.cont && c.atTextStart && p.pos == 0
	}
	startsRep := strings.HasPrefix(p.text, " ") || strings.HasPrefix(p.text, rep)
	if prefix && !startsRep {
		sb.WriteString(rep)
		if !p.first {
			p.safe = false
		}
	} else {
		prefix = false
	}
	cuts = append(cuts, cut{0, 0})
	for i, r := range p.text {
		if r == ' ' || r == ms.replacement {
			if ms.doSplit && sb.Len() > 0 {
				cuts = append(cuts, cut{sb.Len(), i})
			}
			sb.WriteString(rep)
		} else {
			sb.WriteRune(r)
		}
	}
	out := sb.String()
	if !ms.doSplit {
		q := p
		q.text = out
		q.linear, q.inner = false, false
		if out != "" {
			dst = append(dst, q)
		}
		return dst, nil
	}
	for k, ct := range cuts {
		end := len(out)
		if k+1 < len(cuts) {
			end = cuts[k+1].out
		}
		if end == ct.out {
			continue
		}
		q := piece{text: out[ct.out:end]}
		if k == 0 {
			q.pos, q.safe, q.first = p.pos, p.safe, p.first
		} else {
			q.safe = p.inner && p.linear && ct.in >= p.pre
			q.pos = p.pos + ct.in - p.pre
		}
		dst = append(dst, q)
	}
	return dst, nil
}

// digitsPT is HF's Digits pre-tokenizer (char::is_numeric): each digit, or
// each run of digits, is isolated (HF's Contiguous behaviour over single
// digits gives the same pieces as isolating whole runs).
type digitsPT struct{ individual bool }

func (d digitsPT) split(dst []piece, p piece, c *ptCtx) ([]piece, error) {
	m := digitsMatcher{max: 1}
	if !d.individual {
		m.max = len(p.text)
	}
	c.spans, _ = m.findAll(p.text, c.spans[:0])
	return applyBehavior(dst, p, c.spans, bIsolated, false, true, c), nil
}
