package tokenization

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normText is a normalized string with its alignment to the original text.
// al == nil means the identity: normalized byte i is original byte base+i.
// Otherwise al has len(s)+1 entries: al[i] is the original offset that
// normalized offset i corresponds to when i is an anchor (normalizing the
// original text from there on gives exactly s[i:]), or -1.
type normText struct {
	s    string
	al   []int32
	base int
}

func (n *normText) orig(i int) int {
	if n.al == nil {
		return n.base + i
	}
	return int(n.al[i])
}

// anchors returns al, materializing the identity when it is nil.
func (n *normText) anchors() []int32 {
	if n.al != nil {
		return n.al
	}
	al := make([]int32, len(n.s)+1)
	for i := range al {
		al[i] = int32(n.base + i)
	}
	return al
}

// normalizer transforms a normalized text. first is false when the text is a
// continuation of a segment that started earlier (EncodeSuffix), which turns
// off start-of-text behaviours (Prepend, left Strip).
type normalizer interface {
	normalize(in normText, first bool) (normText, error)
}

type normalizerJSON struct {
	Type        string            `json:"type"`
	Normalizers []json.RawMessage `json:"normalizers"`
	Prepend     string            `json:"prepend"`
	Pattern     patternJSON       `json:"pattern"`
	Content     string            `json:"content"`
	Left        bool              `json:"strip_left"`
	Right       bool              `json:"strip_right"`
}

func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var j normalizerJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	switch j.Type {
	case "Sequence":
		var seq seqNormalizer
		for _, r := range j.Normalizers {
			n, err := parseNormalizer(r)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return seq, nil
	case "NFC":
		return unicodeNormalizer{norm.NFC}, nil
	case "NFKC":
		return unicodeNormalizer{norm.NFKC}, nil
	case "NFD":
		return unicodeNormalizer{norm.NFD}, nil
	case "NFKD":
		return unicodeNormalizer{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNormalizer{}, nil
	case "Prepend":
		return prependNormalizer{j.Prepend}, nil
	case "Strip":
		return stripNormalizer{left: j.Left, right: j.Right}, nil
	case "Replace":
		m, err := compilePattern(j.Pattern)
		if err != nil {
			return nil, fmt.Errorf("normalizer Replace: %w", err)
		}
		return replaceNormalizer{m: m, content: j.Content}, nil
	}
	return nil, fmt.Errorf("unsupported normalizer %q", j.Type)
}

type seqNormalizer []normalizer

func (s seqNormalizer) normalize(in normText, first bool) (normText, error) {
	var err error
	for _, n := range s {
		if in, err = n.normalize(in, first); err != nil {
			return in, err
		}
	}
	return in, nil
}

// rebuild is a helper collecting output text and anchors while a normalizer
// walks its input.
type rebuild struct {
	b  strings.Builder
	al []int32
	in normText
}

func newRebuild(in normText, capHint int) *rebuild {
	r := &rebuild{in: in}
	r.b.Grow(capHint)
	r.al = make([]int32, 0, capHint+1)
	return r
}

// emit appends out, produced from input bytes starting at inPos; the start of
// out is anchored to inPos when anchor is set.
func (r *rebuild) emit(out string, inPos int, anchor bool) {
	for i := 0; i < len(out); i++ {
		if i == 0 && anchor {
			r.al = append(r.al, int32(r.in.orig(inPos)))
		} else {
			r.al = append(r.al, -1)
		}
	}
	r.b.WriteString(out)
}

func (r *rebuild) done(inEnd int) normText {
	r.al = append(r.al, int32(r.in.orig(inEnd)))
	return normText{s: r.b.String(), al: r.al, base: r.in.base}
}

// unicodeNormalizer applies NFC/NFKC/NFD/NFKD. It normalizes the text in
// segments cut at normalization boundaries, which is equal to normalizing
// the whole text and gives exact anchors at every segment start.
type unicodeNormalizer struct{ f norm.Form }

func (u unicodeNormalizer) normalize(in normText, first bool) (normText, error) {
	if u.f.IsNormalString(in.s) {
		// every position of a normalized string is an anchor: a suffix of a
		// normalized string is normalized (nothing before it to compose with)
		return in, nil
	}
	r := newRebuild(in, len(in.s)+8)
	al := in.anchors()
	var buf []byte
	for i := 0; i < len(in.s); {
		end := nextNormOpaque(in.s, i)
		if end == i {
			// the reference's older Unicode data sees a plain starter here:
			// copy it and cut normalization around it
			_, n := utf8.DecodeRuneInString(in.s[i:])
			r.b.WriteString(in.s[i : i+n])
			r.al = append(r.al, al[i:i+n]...)
			i += n
			continue
		}
		for i < end {
			// the longest already-normal prefix ends at a boundary and keeps
			// every anchor
			if n := u.f.QuickSpanString(in.s[i:end]); n > 0 {
				r.b.WriteString(in.s[i : i+n])
				r.al = append(r.al, al[i:i+n]...)
				i += n
				continue
			}
			// one segment up to the next boundary, anchored at its start
			n := u.f.NextBoundaryInString(in.s[i:end], true)
			if n <= 0 {
				n = end - i
			}
			buf = u.f.AppendString(buf[:0], in.s[i:i+n])
			if string(buf) == in.s[i:i+n] {
				// unchanged: a suffix of a normalized segment is normalized,
				// so every anchor holds (as on the IsNormalString path)
				r.al = append(r.al, al[i:i+n]...)
			} else {
				r.al = append(r.al, al[i])
				for k := 1; k < len(buf); k++ {
					r.al = append(r.al, -1)
				}
			}
			r.b.Write(buf)
			i += n
		}
	}
	return r.done(len(in.s)), nil
}

// nextNormOpaque returns the offset of the first normOpaque rune at or after
// i, or len(s).
func nextNormOpaque(s string, i int) int {
	for i < len(s) {
		if s[i] < utf8.RuneSelf {
			i++
			continue
		}
		c, n := utf8.DecodeRuneInString(s[i:])
		if unicode.Is(normOpaque, c) {
			return i
		}
		i += n
	}
	return len(s)
}

// lowercaseNormalizer is Rust's char::to_lowercase applied per char (the
// reference's mapping, lowerTable, for non-ASCII).
type lowercaseNormalizer struct{}

func lowerOf(c rune) (string, bool) {
	if c < utf8.RuneSelf {
		if c >= 'A' && c <= 'Z' {
			return string(c + 32), true
		}
		return "", false
	}
	l, ok := lowerTable[c]
	return l, ok
}

func (lowercaseNormalizer) normalize(in normText, first bool) (normText, error) {
	changed := false
	for _, c := range in.s {
		if _, ok := lowerOf(c); ok {
			changed = true
			break
		}
	}
	if !changed {
		return in, nil
	}
	r := newRebuild(in, len(in.s)+8)
	for i := 0; i < len(in.s); {
		c, n := utf8.DecodeRuneInString(in.s[i:])
		if l, ok := lowerOf(c); ok {
			r.emit(l, i, true)
		} else {
			r.emit(in.s[i:i+n], i, true)
		}
		i += n
	}
	return r.done(len(in.s)), nil
}

type prependNormalizer struct{ p string }

func (p prependNormalizer) normalize(in normText, first bool) (normText, error) {
	if !first || in.s == "" || p.p == "" {
		return in, nil
	}
	al := in.anchors()
	out := normText{s: p.p + in.s, base: in.base, al: make([]int32, 0, len(p.p)+len(al))}
	out.al = append(out.al, al[0])
	for i := 1; i <= len(p.p); i++ {
		// a continuation can never start right after the prefix: it would lack it
		out.al = append(out.al, -1)
	}
	out.al = append(out.al, al[1:]...)
	return out, nil
}

type stripNormalizer struct{ left, right bool }

func (s stripNormalizer) normalize(in normText, first bool) (normText, error) {
	st, en := 0, len(in.s)
	if s.left && first {
		for st < en {
			c, n := utf8.DecodeRuneInString(in.s[st:])
			if !isRustWhitespace(c) {
				break
			}
			st += n
		}
	}
	if s.right {
		for en > st {
			c, n := utf8.DecodeLastRuneInString(in.s[st:en])
			if !isRustWhitespace(c) {
				break
			}
			en -= n
		}
	}
	if st == 0 && en == len(in.s) {
		return in, nil
	}
	out := normText{s: in.s[st:en], base: in.base}
	al := in.anchors()
	out.al = append([]int32(nil), al[st:en+1]...)
	if en < len(in.s) {
		out.al[len(out.al)-1] = al[len(al)-1]
	}
	if st > 0 {
		out.al[0] = al[0]
	}
	return out, nil
}

type replaceNormalizer struct {
	m       matcher
	content string
}

func (rp replaceNormalizer) normalize(in normText, first bool) (normText, error) {
	ms, err := rp.m.findAll(in.s, nil)
	if err != nil {
		return in, err
	}
	if len(ms) == 0 {
		return in, nil
	}
	r := newRebuild(in, len(in.s)+len(ms)*len(rp.content))
	al := in.anchors()
	loc := rp.m.local()
	prev := 0
	for _, m := range ms {
		// unmatched text keeps its anchors when the pattern is local
		for i := prev; i < m.start; i++ {
			if loc {
				r.al = append(r.al, al[i])
			} else {
				r.al = append(r.al, -1)
			}
		}
		r.b.WriteString(in.s[prev:m.start])
		r.emit(rp.content, m.start, loc)
		prev = m.end
	}
	for i := prev; i < len(in.s); i++ {
		if loc {
			r.al = append(r.al, al[i])
		} else {
			r.al = append(r.al, -1)
		}
	}
	r.b.WriteString(in.s[prev:])
	out := r.done(len(in.s))
	if len(out.al) > 0 {
		out.al[0] = al[0]
	}
	return out, nil
}
