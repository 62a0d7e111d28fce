package tokenization

import (
	"cmp"
	"errors"
	"slices"
	"strings"
	"unicode/utf8"
)

// A lower bound on the ids BPE gives one word, so that a word that alone
// takes the ids past a caller's limit is refused before it is merged.
//
// Merging is O(n log n) with ~80 bytes of memory per byte for a word that
// is one unbroken run of letters (the pre-tokenizer cannot split it), and
// such a word can be a whole 8 MB prompt. The token limit checked after each
// word would refuse it only once it is merged. The bound below needs one
// pass over the word's initial symbols and 2 bytes per symbol.
//
// Why it is sound: BPE's output is a sequence of symbols each covering a run
// of the word's initial symbols (one per byte for a byte-level model; one per
// character, byte-fallback byte or unknown run otherwise), and the run a
// symbol with id c covers is one of c's expansions: [c] itself when c can be
// an initial symbol, or an expansion of a followed by one of b for each merge
// (a, b) -> c in the merge table. So any output is a segmentation of the
// initial symbols into expansions, and the fewest pieces such a segmentation
// can have is a lower bound. A relaxation of that minimum is computed in
// linear time: an Aho-Corasick automaton over all expansions gives, for each
// end position p, the length l(p) of the longest expansion ending there;
// every piece ending at p starts at or after p - l(p), and the fewest jumps
// back from the end to 0 where a jump from p may land anywhere in
// [p-l(p), p-1] is at most the number of pieces of any segmentation. The
// bound is computed only when the word has more initial symbols than the
// ids the caller still accepts and at least 1 KiB (minBoundedWord), so
// ordinary words never pay for it.
//
// When the merge table is too odd to expand (a cycle of merges, an id far
// above the vocabulary's size, expansions beyond the caps below) there is no
// bound and long words are merged as before: never a wrong refusal.

// errWordOverBudget is encodeWord's answer when the bound proves the word
// alone gives more ids than its budget.
var errWordOverBudget = errors.New("word has more tokens than the budget")

// Caps on the automaton's construction: beyond them the model has no bound.
const (
	maxExpansionsPerID = 8         // distinct expansions of one id
	maxExpansionSyms   = 1 << 23   // symbols over all expansions (32 MiB while building)
	maxExpansionLen    = 1<<16 - 1 // l(p) is kept in a uint16
)

// segAutomaton is the Aho-Corasick automaton over all expansions. Children
// are kept sorted per node (CSR) and found by binary search: ~18 bytes per
// node, about 6 MB for a 150k-token byte-level vocabulary.
type segAutomaton struct {
	root  []int32  // symbol -> the root's child (0: none): most steps start there
	first []int32  // node -> start of its children in syms/child; len nodes+1
	syms  []uint32 // child symbols, ascending per node
	child []int32
	fail  []int32
	best  []uint16 // longest expansion that is a suffix of the node's path
}

func (a *segAutomaton) next(node int32, s uint32) (int32, bool) {
	if node == 0 {
		if int(s) < len(a.root) && a.root[s] != 0 {
			return a.root[s], true
		}
		return 0, false
	}
	lo, hi := int(a.first[node]), int(a.first[node+1])
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if a.syms[mid] < s {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo < int(a.first[node+1]) && a.syms[lo] == s {
		return a.child[lo], true
	}
	return 0, false
}

// step is the automaton's transition from node on symbol s.
func (a *segAutomaton) step(node int32, s uint32) int32 {
	for {
		if c, ok := a.next(node, s); ok {
			return c
		}
		if node == 0 {
			return 0
		}
		node = a.fail[node]
	}
}

// initialIDs are the ids encodeWord can put in a word's first symbols.
func (m *bpeModel) initialIDs() map[uint32]bool {
	ids := map[uint32]bool{}
	if m.unkID >= 0 {
		ids[uint32(m.unkID)] = true
	}
	if m.raw {
		for _, id := range m.byteIDs {
			if id >= 0 {
				ids[uint32(id)] = true
			}
		}
		return ids
	}
	for _, id := range m.fallbackIDs {
		if id >= 0 {
			ids[uint32(id)] = true
		}
	}
	for k, id := range m.vocab {
		// a character, with the continuing prefix and the end-of-word
		// suffix it may carry (a superset is sound: it only adds expansions)
		for _, s := range []string{k, strings.TrimPrefix(k, m.prefix), strings.TrimSuffix(k, m.suffix),
			strings.TrimSuffix(strings.TrimPrefix(k, m.prefix), m.suffix)} {
			if s != "" && utf8.RuneCountInString(s) == 1 {
				ids[id] = true
				break
			}
		}
	}
	return ids
}

// buildSegAutomaton expands every id over the merge table and builds the
// automaton; nil when the table cannot be expanded within the caps.
func (m *bpeModel) buildSegAutomaton() *segAutomaton {
	initial := m.initialIDs()
	type pair struct{ a, b, c uint32 }
	var pairs []pair
	maxID := uint32(0)
	for id := range initial {
		maxID = max(maxID, id)
	}
	for _, s := range m.merges.slots {
		if s.key == emptyPair {
			continue
		}
		p := pair{uint32(s.key >> 32), uint32(s.key), uint32(s.val)}
		pairs = append(pairs, p)
		maxID = max(maxID, p.a, p.b, p.c)
	}
	if int(maxID) > 4*(len(m.vocab)+len(pairs))+1024 {
		return nil // sparse ids: not worth tables this large
	}
	n := int(maxID) + 1
	// Kahn's order over "c needs a and b": an id is expanded once every
	// merge producing it has both parts expanded; ids left over are on a
	// cycle, and a cycle has no finite expansion set.
	pending := make([]int32, n)
	users := make([][]int32, n) // id -> pairs using it as a part
	producers := make([][]int32, n)
	for i, p := range pairs {
		pending[p.c] += 2
		users[p.a] = append(users[p.a], int32(i))
		users[p.b] = append(users[p.b], int32(i))
		producers[p.c] = append(producers[p.c], int32(i))
	}
	exps := make([][][]uint32, n)
	total := 0
	queue := make([]uint32, 0, n)
	for id := 0; id < n; id++ {
		if pending[id] == 0 {
			queue = append(queue, uint32(id))
		}
	}
	done := 0
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		done++
		var set [][]uint32
		if initial[c] {
			set = append(set, []uint32{c})
		}
		for _, pi := range producers[c] {
			p := pairs[pi]
			for _, x := range exps[p.a] {
				for _, y := range exps[p.b] {
					if len(x)+len(y) > maxExpansionLen {
						return nil
					}
					e := append(append(make([]uint32, 0, len(x)+len(y)), x...), y...)
					if !slices.ContainsFunc(set, func(s []uint32) bool { return slices.Equal(s, e) }) {
						set = append(set, e)
						total += len(e)
					}
				}
			}
			if len(set) > maxExpansionsPerID || total > maxExpansionSyms {
				return nil
			}
		}
		exps[c] = set
		for _, pi := range users[c] {
			p := pairs[pi]
			if pending[p.c]--; pending[p.c] == 0 {
				queue = append(queue, p.c)
			}
		}
	}
	if done < n {
		return nil
	}
	return newSegAutomaton(exps)
}

func newSegAutomaton(exps [][][]uint32) *segAutomaton {
	type edge struct {
		from int32
		sym  uint32
		to   int32
	}
	kids := map[uint64]int32{}
	depth := []uint16{0}
	terminal := []bool{false}
	var edges []edge
	for _, set := range exps {
		for _, e := range set {
			node := int32(0)
			for _, s := range e {
				k := uint64(node)<<32 | uint64(s)
				c, ok := kids[k]
				if !ok {
					c = int32(len(depth))
					kids[k] = c
					depth = append(depth, depth[node]+1)
					terminal = append(terminal, false)
					edges = append(edges, edge{node, s, c})
				}
				node = c
			}
			terminal[node] = true
		}
	}
	nodes := len(depth)
	slices.SortFunc(edges, func(x, y edge) int {
		if c := cmp.Compare(x.from, y.from); c != 0 {
			return c
		}
		return cmp.Compare(x.sym, y.sym)
	})
	a := &segAutomaton{first: make([]int32, nodes+1), syms: make([]uint32, len(edges)), child: make([]int32, len(edges)),
		fail: make([]int32, nodes), best: make([]uint16, nodes)}
	for i, e := range edges {
		a.first[e.from+1]++
		a.syms[i], a.child[i] = e.sym, e.to
	}
	for i := 1; i <= nodes; i++ {
		a.first[i] += a.first[i-1]
	}
	if k := a.first[1]; k > 0 {
		a.root = make([]int32, a.syms[k-1]+1)
		for i := int32(0); i < k; i++ {
			a.root[a.syms[i]] = a.child[i]
		}
	}
	// breadth first, so a node's failure link (shallower) is done before it
	queue := []int32{0}
	for len(queue) > 0 {
		u := queue[0]
		queue = queue[1:]
		for i := a.first[u]; i < a.first[u+1]; i++ {
			v, s := a.child[i], a.syms[i]
			if u != 0 {
				a.fail[v] = a.step(a.fail[u], s)
			}
			if terminal[v] {
				a.best[v] = depth[v]
			} else {
				a.best[v] = a.best[a.fail[v]]
			}
			queue = append(queue, v)
		}
	}
	return a
}

// segmentBound is the lower bound over a word's initial symbols, fed one at
// a time by feed (which calls emit for each and returns ctx's error every
// mergeCheckEvery symbols); 0 when there is none.
func (a *segAutomaton) segmentBound(n int, feed func(emit func(uint32) bool) error) (int, error) {
	ell := make([]uint16, 0, n)
	node := int32(0)
	ok := true
	err := feed(func(s uint32) bool {
		node = a.step(node, s)
		l := a.best[node]
		if l == 0 {
			// s is not an initial symbol of any expansion: the model
			// emits a symbol the expansion missed, so no bound
			ok = false
			return false
		}
		ell = append(ell, l)
		return true
	})
	if err != nil || !ok {
		return 0, err
	}
	// fewest jumps back from len(ell) to 0; a jump from p lands anywhere in
	// [p-l(p), p-1], so the positions reachable in k jumps are an interval
	// [lo, end] and each step extends it to the furthest landing point
	count, lo, p := 0, len(ell), len(ell)
	for lo > 0 {
		next := lo
		for ; p >= lo && p > 0; p-- {
			next = min(next, p-int(ell[p-1]))
		}
		count++
		lo = next
	}
	return count, nil
}
