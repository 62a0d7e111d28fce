// Package tokenization is a pure-Go encoder for HuggingFace tokenizer.json
// files, id-for-id equal to HF tokenizers (Rust) for the supported
// components, plus split boundaries that let a prefix cache reuse ids.
package tokenization

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
)

// Tokenizer encodes text to token ids. Safe for concurrent use.
type Tokenizer struct {
	rawTrie  *tokenTrie // added tokens matched on the original text
	normTrie *tokenTrie // added tokens matched on normalized text
	norm     normalizer
	pre      []preTokenizer
	model    *bpeModel
	tmpl     template
	// singleWord disables boundaries at added tokens (their match depends
	// on the neighbouring characters).
	singleWord bool
	maxAdded   int       // longest added-token content, bytes
	state      sync.Pool // *encState
}

// Boundary is a byte offset in the original text where pre-tokenization
// split, with the number of ids (including leading special tokens) produced
// before it.
type Boundary struct {
	Offset int
	Tokens int
}

type tokenizerFile struct {
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Model         json.RawMessage `json:"model"`
	PostProcessor json.RawMessage `json:"post_processor"`
}

// Load builds a tokenizer from tokenizer.json and, optionally,
// tokenizer_config.json. The config matters where transformers honours it:
// Llama/CodeLlama/Gemma fast tokenizers rebuild the post-processor from
// add_bos_token / add_eos_token (see rebuildsPostProcessor). truncation and
// padding are ignored, as transformers disables them unless asked.
// Any unsupported component is an error naming it.
func Load(tokenizerJSON, tokenizerConfigJSON []byte) (*Tokenizer, error) {
	var f tokenizerFile
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if len(f.Model) == 0 {
		return nil, errors.New("tokenizer.json: no model")
	}
	t := &Tokenizer{}
	var err error
	if t.norm, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if t.model, err = parseBPE(f.Model); err != nil {
		return nil, err
	}
	if t.tmpl, err = parsePostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	toks := assignAddedIDs(f.AddedTokens, t.model.vocab)
	lookup := func(s string) (uint32, bool) {
		for _, tk := range toks {
			if tk.Content == s {
				return tk.ID, true
			}
		}
		id, ok := t.model.vocab[s]
		return id, ok
	}
	if ct, ok, err := configTemplate(tokenizerConfigJSON, lookup); err != nil {
		return nil, err
	} else if ok {
		t.tmpl = ct
	}

	// ByteLevel must be the last pre-tokenizer (it changes the alphabet).
	for i, p := range t.pre {
		if bl, ok := p.(*byteLevelPT); ok {
			if i != len(t.pre)-1 {
				return nil, errors.New("unsupported pre_tokenizer: ByteLevel followed by other pre-tokenizers")
			}
			if t.model.prefix == "" && t.model.suffix == "" {
				bl.raw = true
				t.model.useRawBytes()
			}
		}
	}

	var raw, normd []*addedToken
	for _, tk := range toks {
		if tk.Normalized {
			normd = append(normd, tk)
		} else {
			raw = append(raw, tk)
		}
	}
	t.rawTrie = newTokenTrie(raw, func(a *addedToken) string { return a.Content })
	var nerr error
	t.normTrie = newTokenTrie(normd, func(a *addedToken) string {
		if t.norm == nil {
			return a.Content
		}
		n, err := t.norm.normalize(normText{s: a.Content}, true)
		if err != nil {
			nerr = err
		}
		return n.s
	})
	if nerr != nil {
		return nil, nerr
	}
	split, err := splitSpecialTokens(tokenizerConfigJSON)
	if err != nil {
		return nil, err
	}
	t.rawTrie.encodeSpecial, t.normTrie.encodeSpecial = split, split
	t.singleWord = hasSingleWord(toks)
	for _, tk := range toks {
		t.maxAdded = max(t.maxAdded, len(tk.Content))
	}
	t.state.New = func() any { return new(encState) }
	return t, nil
}

type encState struct {
	splits  []addedSplit
	nsplits []addedSplit
	pa, pb  []piece
	ctx     ptCtx
	bounds  []Boundary
	// done is the request's context, checked every ctxCheckBytes of words
	// (and inside the merging of one long word).
	done      context.Context
	unchecked int
	// limit is the most ids the caller accepts (0: no limit), checked after
	// every word so an over-limit prompt stops there, not at its end.
	limit int
}

// ErrTooManyTokens is the error of the *Limit encodes once the ids passed
// their limit: the rest of the text is not encoded.
var ErrTooManyTokens = errors.New("too many tokens")

// ctxCheckBytes is how many bytes of words are encoded between two checks
// of the request's context: tens of microseconds of work.
const ctxCheckBytes = 64 << 10

// MaxAddedTokenBytes is the length of the longest added token's content. A
// prefix cache keeps at least this distance from the end of a cached prefix,
// so that an added token straddling it cannot change reused ids.
func (t *Tokenizer) MaxAddedTokenBytes() int { return t.maxAdded }

// Encode returns the ids of text; with addSpecialTokens the post-processor's
// special tokens (e.g. BOS) are added.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	ids, _, err := t.encode(context.Background(), text, 0, addSpecialTokens, false, 0)
	return ids, err
}

// EncodeLimit is Encode that gives up with ErrTooManyTokens as soon as the
// ids (special tokens included) number more than maxTokens (<= 0: no
// limit), within one pre-tokenized word of the point where they passed it.
// Below the limit the ids are Encode's.
func (t *Tokenizer) EncodeLimit(text string, addSpecialTokens bool, maxTokens int) ([]uint32, error) {
	ids, _, err := t.encode(context.Background(), text, 0, addSpecialTokens, false, maxTokens)
	return ids, err
}

// EncodeBoundaries is Encode plus the split boundaries (ascending offsets).
// Every boundary b satisfies ids[:b.Tokens] + EncodeSuffix(text, b.Offset)
// == ids; the end of the text is always the last boundary (none is
// reported at offset 0).
func (t *Tokenizer) EncodeBoundaries(text string, addSpecialTokens bool) ([]uint32, []Boundary, error) {
	return t.encode(context.Background(), text, 0, addSpecialTokens, true, 0)
}

// EncodeBoundariesContext is EncodeBoundaries that stops with ctx's error
// soon after ctx is done (a request whose client left must not keep a core
// busy on a long prompt).
func (t *Tokenizer) EncodeBoundariesContext(ctx context.Context, text string, addSpecialTokens bool) ([]uint32, []Boundary, error) {
	return t.encode(ctx, text, 0, addSpecialTokens, true, 0)
}

// EncodeBoundariesLimit is EncodeBoundariesContext that also gives up with
// ErrTooManyTokens once the ids number more than maxTokens (see
// EncodeLimit): a prompt the caller will refuse for its length costs the
// work up to the limit, not the work of all of it.
func (t *Tokenizer) EncodeBoundariesLimit(ctx context.Context, text string, addSpecialTokens bool, maxTokens int) ([]uint32, []Boundary, error) {
	return t.encode(ctx, text, 0, addSpecialTokens, true, maxTokens)
}

// EncodeSuffix returns the ids of text[from:] exactly as they follow the
// first b.Tokens ids of Encode(text), provided from is the offset of a
// boundary b of EncodeBoundaries(text). No leading special tokens are added
// for from > 0; trailing ones (EOS) are when addSpecialTokens is set.
func (t *Tokenizer) EncodeSuffix(text string, from int, addSpecialTokens bool) ([]uint32, error) {
	if from < 0 || from > len(text) {
		return nil, fmt.Errorf("EncodeSuffix: offset %d out of range [0,%d]", from, len(text))
	}
	ids, _, err := t.encode(context.Background(), text, from, addSpecialTokens, false, 0)
	return ids, err
}

// EncodeSuffixBoundaries is EncodeSuffix plus the boundaries inside the
// suffix: absolute offsets in text, Tokens counted from the suffix's first
// id. Each is a boundary of EncodeBoundaries(text) shifted by the ids before
// from, so a prefix cache can extend its entries without a full encode.
func (t *Tokenizer) EncodeSuffixBoundaries(text string, from int, addSpecialTokens bool) ([]uint32, []Boundary, error) {
	if from < 0 || from > len(text) {
		return nil, nil, fmt.Errorf("EncodeSuffixBoundaries: offset %d out of range [0,%d]", from, len(text))
	}
	return t.encode(context.Background(), text, from, addSpecialTokens, true, 0)
}

// EncodeSuffixBoundariesContext is EncodeSuffixBoundaries that stops with
// ctx's error soon after ctx is done.
func (t *Tokenizer) EncodeSuffixBoundariesContext(ctx context.Context, text string, from int, addSpecialTokens bool) ([]uint32, []Boundary, error) {
	if from < 0 || from > len(text) {
		return nil, nil, fmt.Errorf("EncodeSuffixBoundaries: offset %d out of range [0,%d]", from, len(text))
	}
	return t.encode(ctx, text, from, addSpecialTokens, true, 0)
}

// EncodeSuffixBoundariesLimit is EncodeSuffixBoundariesContext that gives
// up with ErrTooManyTokens once the suffix's ids number more than maxTokens
// (the caller passes its limit less the ids before from).
func (t *Tokenizer) EncodeSuffixBoundariesLimit(ctx context.Context, text string, from int, addSpecialTokens bool, maxTokens int) ([]uint32, []Boundary, error) {
	if from < 0 || from > len(text) {
		return nil, nil, fmt.Errorf("EncodeSuffixBoundaries: offset %d out of range [0,%d]", from, len(text))
	}
	return t.encode(ctx, text, from, addSpecialTokens, true, maxTokens)
}

func (t *Tokenizer) encode(ctx context.Context, text string, from int, add, wantB bool, limit int) ([]uint32, []Boundary, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	st := t.state.Get().(*encState)
	defer t.state.Put(st)
	st.bounds = st.bounds[:0]
	st.done, st.unchecked, st.limit = ctx, 0, max(limit, 0)
	defer func() { st.done = nil }() // do not keep the request's context in the pool
	n := 16 + (len(text)-from)/3
	if limit > 0 {
		n = min(n, limit+16) // an over-limit prompt does not get ids for all of it
	}
	ids := make([]uint32, 0, n)
	normCont, preCont := false, false
	if from > 0 {
		var err error
		if normCont, preCont, err = t.continuation(st, text, from); err != nil {
			return nil, nil, err
		}
	} else if add {
		ids = append(ids, t.tmpl.lead...)
	}
	ids, err := t.run(st, ids, text, from, normCont, preCont, wantB)
	if err != nil {
		return nil, nil, err
	}
	var bounds []Boundary
	if wantB {
		t.addBoundary(st, len(text), len(ids))
		bounds = append([]Boundary(nil), st.bounds...)
	}
	if add {
		ids = append(ids, t.tmpl.trail...)
	}
	if st.limit > 0 && len(ids) > st.limit {
		return nil, nil, st.tooMany()
	}
	return ids, bounds, nil
}

// wordBefore reports, for a tokenizer with single_word added tokens, that a
// word character precedes pos in the normalized segment ns. EncodeSuffix
// from there would not see it, and a single_word token starting at pos would
// match in the suffix where the whole text's match rejects it (HF requires a
// non-word character before): no boundary there.
func (t *Tokenizer) wordBefore(ns string, pos int) bool {
	return t.singleWord && pos > 0 && isWordChar(lastRune(ns[:pos]))
}

func (t *Tokenizer) addBoundary(st *encState, off, n int) {
	if off == 0 {
		// EncodeSuffix(text, 0) is Encode(text), leading specials included
		return
	}
	if k := len(st.bounds); k > 0 && st.bounds[k-1].Offset >= off {
		return
	}
	st.bounds = append(st.bounds, Boundary{Offset: off, Tokens: n})
}

// continuation tells how text[from:] continues the text before it: normCont
// when from is inside a segment between added tokens (no start-of-text
// normalization), preCont when it is also inside a pre-tokenization input.
func (t *Tokenizer) continuation(st *encState, text string, from int) (normCont, preCont bool, err error) {
	w := t.rawTrie.scanStart(text, from, t.singleWord)
	st.splits = t.rawTrie.split(text[w:from], st.splits[:0])
	if w > 0 && !t.normTrie.empty && (len(st.splits) == 0 || len(st.splits) == 1 && st.splits[0].tok == nil) {
		// the text segment ending at from may start before the window, and
		// the normalized-token check below needs all of it
		w = 0
		st.splits = t.rawTrie.split(text[:from], st.splits[:0])
	}
	n := len(st.splits)
	if n == 0 {
		return true, true, nil // from follows a text byte (and normTrie is empty)
	}
	last := st.splits[n-1]
	if last.tok != nil {
		return false, false, nil
	}
	if t.normTrie.empty {
		return true, true, nil
	}
	segStart := w + last.start
	nt := normText{s: text[segStart:from], base: segStart}
	if t.norm != nil {
		if nt, err = t.norm.normalize(nt, true); err != nil {
			return false, false, err
		}
	}
	st.nsplits = t.normTrie.split(nt.s, st.nsplits[:0])
	if n := len(st.nsplits); n > 0 && st.nsplits[n-1].tok != nil {
		return true, false, nil
	}
	return true, true, nil
}

func (t *Tokenizer) run(st *encState, ids []uint32, text string, from int, normCont, preCont, wantB bool) ([]uint32, error) {
	st.splits = t.rawTrie.split(text[from:], st.splits[:0])
	for _, sp := range st.splits {
		s, e := from+sp.start, from+sp.end
		if sp.tok != nil {
			if wantB && !t.singleWord {
				t.addBoundary(st, s, len(ids))
			}
			ids = append(ids, sp.tok.ID)
			continue
		}
		firstSeg := s == from
		nt := normText{s: text[s:e], base: s}
		if t.norm != nil {
			var err error
			if nt, err = t.norm.normalize(nt, !(firstSeg && normCont)); err != nil {
				return nil, err
			}
		}
		st.nsplits = t.normTrie.split(nt.s, st.nsplits[:0])
		for _, ns := range st.nsplits {
			if ns.tok != nil {
				if wantB && !t.singleWord {
					if o := nt.orig(ns.start); o >= 0 {
						t.addBoundary(st, o, len(ids))
					}
				}
				ids = append(ids, ns.tok.ID)
				continue
			}
			p := piece{text: nt.s[ns.start:ns.end], pos: ns.start, linear: true, safe: true, inner: true, first: true}
			st.ctx.cont = firstSeg && ns.start == 0 && preCont
			st.ctx.atTextStart = nt.base == 0
			words, err := t.pretokenize(st, p)
			if err != nil {
				return nil, err
			}
			for i := range words {
				w := &words[i]
				if wantB && w.safe && !t.wordBefore(nt.s, w.pos) {
					if o := nt.orig(w.pos); o >= 0 {
						t.addBoundary(st, o, len(ids))
					}
				}
				budget := -1
				if st.limit > 0 {
					budget = max(st.limit-len(ids), 0)
				}
				var err error
				if ids, err = t.model.encodeWord(st.done, ids, w.text, budget); err != nil {
					if errors.Is(err, errWordOverBudget) {
						return nil, st.tooMany()
					}
					return nil, err
				}
				if st.limit > 0 && len(ids) > st.limit {
					return nil, st.tooMany()
				}
				if st.unchecked += len(w.text); st.unchecked >= ctxCheckBytes {
					st.unchecked = 0
					if err := st.done.Err(); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	return ids, nil
}

func (st *encState) tooMany() error {
	return fmt.Errorf("%w: more than %d", ErrTooManyTokens, st.limit)
}

// pretokenize runs the pre-tokenizer stages over one input piece.
func (t *Tokenizer) pretokenize(st *encState, p piece) ([]piece, error) {
	cur := append(st.pa[:0], p)
	next := st.pb[:0]
	var err error
	for _, stage := range t.pre {
		next = next[:0]
		for _, q := range cur {
			if next, err = stage.split(next, q, &st.ctx); err != nil {
				return nil, err
			}
		}
		cur, next = next, cur
	}
	st.pa, st.pb = cur, next
	return cur, nil
}

// assignAddedIDs gives added tokens the ids HF's AddedVocabulary::add_tokens
// gives them when it loads tokenizer.json: the model's id when the content
// is in the vocabulary, else the next id after the vocabulary and earlier
// added tokens. (The "id" field of the file is only checked by HF; real
// files agree with it.) A later entry with the same content replaces an
// earlier one.
func assignAddedIDs(in []addedToken, vocab map[string]uint32) []*addedToken {
	byContent := map[string]int{}
	var out []*addedToken
	vocabSize := uint32(len(vocab))
	haveMax, maxID := false, uint32(0)
	for i := range in {
		tk := in[i]
		if tk.Content == "" {
			continue
		}
		if j, ok := byContent[tk.Content]; ok && *out[j] == tk {
			continue
		}
		var id uint32
		if j, ok := byContent[tk.Content]; ok {
			id = out[j].ID
		} else if vid, ok := vocab[tk.Content]; ok {
			id = vid
		} else if !haveMax {
			id = vocabSize
		} else if maxID >= vocabSize || vocabSize == 0 {
			id = maxID + 1
		} else {
			id = vocabSize
		}
		tk.ID = id
		if !haveMax || id > maxID {
			haveMax, maxID = true, id
		}
		if j, ok := byContent[tk.Content]; ok {
			out[j] = &tk
		} else {
			byContent[tk.Content] = len(out)
			out = append(out, &tk)
		}
	}
	return out
}
