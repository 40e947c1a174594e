package tokenizer

import (
	"container/heap"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// bpe is a byte-pair-encoding model: a word's characters (or, for a
// character outside the vocabulary, its bytes' <0xNN> tokens when
// byteFallback is set, else the unknown token) merged pair by pair, the
// pair of lowest rank first and the leftmost among equals, until no
// adjacent pair has a merge. That order is the Rust library's (a heap of
// (rank, position)), which differs from "merge every occurrence of the best
// pair" when a merge's result has a lower rank than the pair it came from.
type bpe struct {
	vocab        map[string]int32
	merges       map[uint64]merge // pair of ids → rank and the merged id
	unk          int32            // -1: none (characters outside the vocabulary are dropped)
	fuseUnk      bool
	byteFallback bool
	byteIDs      [256]int32 // <0xNN> ids, -1 where missing
	ignoreMerges bool       // a word in the vocabulary is one token
	prefix       string     // continuing_subword_prefix
	suffix       string     // end_of_word_suffix

	cache sync.Map // word → []int32, bounded by cacheN
	mu    sync.Mutex
	nc    int
}

type merge struct {
	rank, id int32
}

const cacheMax = 1 << 16

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// tokenize appends the ids of one pre-tokenized word to out.
func (m *bpe) tokenize(word string, out []int32) []int32 {
	if v, ok := m.cache.Load(word); ok {
		return append(out, v.([]int32)...)
	}
	start := len(out)
	out = m.encodeWord(word, out)
	if len(word) < 256 {
		m.mu.Lock()
		if m.nc < cacheMax {
			m.nc++
			// A copy of the word: it may be a slice of a whole request.
			m.cache.Store(strings.Clone(word), append([]int32(nil), out[start:]...))
		}
		m.mu.Unlock()
	}
	return out
}

type symbol struct {
	id         int32
	prev, next int
	dead       bool
}

func (m *bpe) encodeWord(word string, out []int32) []int32 {
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(out, id)
		}
	}
	syms := make([]symbol, 0, len(word))
	pendingUnk := false
	flushUnk := func() {
		if pendingUnk {
			syms = append(syms, symbol{id: m.unk})
			pendingUnk = false
		}
	}
	for i, r := range word {
		size := utf8.RuneLen(r) // the text is valid UTF-8 (Encode checks)
		s := word[i : i+size]
		if i > 0 && m.prefix != "" {
			s = m.prefix + s
		}
		if i+size == len(word) && m.suffix != "" {
			s += m.suffix
		}
		if id, ok := m.vocab[s]; ok {
			flushUnk()
			syms = append(syms, symbol{id: id})
			continue
		}
		if m.byteFallback && m.bytesKnown(word[i:i+size]) {
			// A pending (fused) unknown is not written before the bytes:
			// the Rust library writes it at the next known character.
			for _, b := range []byte(word[i : i+size]) {
				syms = append(syms, symbol{id: m.byteIDs[b]})
			}
			continue
		}
		if m.unk < 0 {
			continue
		}
		if m.fuseUnk {
			pendingUnk = true
			continue
		}
		syms = append(syms, symbol{id: m.unk})
	}
	flushUnk()
	for i := range syms {
		syms[i].prev, syms[i].next = i-1, i+1
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	switch {
	case len(syms) < 2 || len(m.merges) == 0:
	case len(syms) <= shortWord:
		m.mergeShort(syms)
	default:
		m.mergeAll(syms)
	}
	for i := 0; i >= 0 && i < len(syms); i = syms[i].next {
		out = append(out, syms[i].id)
	}
	return out
}

func (m *bpe) bytesKnown(s string) bool {
	for _, b := range []byte(s) {
		if m.byteIDs[b] < 0 {
			return false
		}
	}
	return true
}

// shortWord is the longest word merged by scanning its pairs at each step
// rather than through a heap: the same merges in the same order, cheaper
// for the words most pre-tokenizers make.
const shortWord = 48

// mergeShort merges syms (consecutive, as encodeWord made them) in place:
// at each step the pair of lowest rank, the leftmost among equals.
func (m *bpe) mergeShort(syms []symbol) {
	ids := make([]int32, len(syms), shortWord)
	for i := range syms {
		ids[i] = syms[i].id
	}
	var ranks [shortWord]merge
	for i := 0; i+1 < len(ids); i++ {
		ranks[i] = m.lookup(ids[i], ids[i+1])
	}
	for len(ids) > 1 {
		best := -1
		for i := 0; i+1 < len(ids); i++ {
			if ranks[i].rank >= 0 && (best < 0 || ranks[i].rank < ranks[best].rank) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		ids[best] = ranks[best].id
		copy(ids[best+1:], ids[best+2:])
		copy(ranks[best+1:], ranks[best+2:len(ids)])
		ids = ids[:len(ids)-1]
		if best > 0 {
			ranks[best-1] = m.lookup(ids[best-1], ids[best])
		}
		if best+1 < len(ids) {
			ranks[best] = m.lookup(ids[best], ids[best+1])
		}
	}
	for i := range syms {
		if i < len(ids) {
			syms[i] = symbol{id: ids[i], prev: i - 1, next: i + 1}
		} else {
			syms[i].dead = true
		}
	}
	syms[len(ids)-1].next = -1
}

// lookup is the merge of a pair; rank -1 when there is none.
func (m *bpe) lookup(a, b int32) merge {
	if mg, ok := m.merges[pairKey(a, b)]; ok {
		return mg
	}
	return merge{rank: -1}
}

// candidate is a pair that may merge: the symbol at pos with its next one.
type candidate struct {
	rank, id int32
	pos      int
}

type candidates []candidate

func (c candidates) Len() int { return len(c) }
func (c candidates) Less(i, j int) bool {
	if c[i].rank != c[j].rank {
		return c[i].rank < c[j].rank
	}
	return c[i].pos < c[j].pos
}
func (c candidates) Swap(i, j int) { c[i], c[j] = c[j], c[i] }
func (c *candidates) Push(x any)   { *c = append(*c, x.(candidate)) }
func (c *candidates) Pop() any {
	old := *c
	x := old[len(old)-1]
	*c = old[:len(old)-1]
	return x
}

func (m *bpe) mergeAll(syms []symbol) {
	q := make(candidates, 0, len(syms))
	for i := 0; i+1 < len(syms); i++ {
		if mg, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			q = append(q, candidate{rank: mg.rank, id: mg.id, pos: i})
		}
	}
	heap.Init(&q)
	for q.Len() > 0 {
		c := heap.Pop(&q).(candidate)
		s := &syms[c.pos]
		if s.dead || s.next < 0 {
			continue
		}
		right := &syms[s.next]
		if mg, ok := m.merges[pairKey(s.id, right.id)]; !ok || mg.id != c.id {
			continue // stale: one side has merged since
		}
		s.id = c.id
		right.dead = true
		s.next = right.next
		if s.next >= 0 {
			syms[s.next].prev = c.pos
		}
		if s.prev >= 0 {
			if mg, ok := m.merges[pairKey(syms[s.prev].id, s.id)]; ok {
				heap.Push(&q, candidate{rank: mg.rank, id: mg.id, pos: s.prev})
			}
		}
		if s.next >= 0 {
			if mg, ok := m.merges[pairKey(s.id, syms[s.next].id)]; ok {
				heap.Push(&q, candidate{rank: mg.rank, id: mg.id, pos: c.pos})
			}
		}
	}
}

// newBPE builds the model from its vocabulary and merges (each "a b" or
// ["a", "b"]).
func newBPE(vocab map[string]int32, merges [][2]string, unk string, fuseUnk, byteFallback, ignoreMerges bool, prefix, suffix string) (*bpe, error) {
	m := &bpe{vocab: vocab, unk: -1, fuseUnk: fuseUnk, byteFallback: byteFallback,
		ignoreMerges: ignoreMerges, prefix: prefix, suffix: suffix,
		merges: make(map[uint64]merge, len(merges))}
	if unk != "" {
		id, ok := vocab[unk]
		if !ok {
			return nil, formatErr("the BPE model's unk_token %q is not in its vocabulary", unk)
		}
		m.unk = id
	}
	for b := range 256 {
		m.byteIDs[b] = -1
		if id, ok := vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteIDs[b] = id
		}
	}
	for rank, p := range merges {
		a, ok := vocab[p[0]]
		if !ok {
			return nil, formatErr("merge %d (%q %q): %q is not in the vocabulary", rank, p[0], p[1], p[0])
		}
		b, ok := vocab[p[1]]
		if !ok {
			return nil, formatErr("merge %d (%q %q): %q is not in the vocabulary", rank, p[0], p[1], p[1])
		}
		right := p[1]
		if prefix != "" && len(right) >= len(prefix) && right[:len(prefix)] == prefix {
			right = right[len(prefix):]
		}
		id, ok := vocab[p[0]+right]
		if !ok {
			return nil, formatErr("merge %d (%q %q): the merged token %q is not in the vocabulary", rank, p[0], p[1], p[0]+right)
		}
		m.merges[pairKey(a, b)] = merge{rank: int32(rank), id: id} // a repeated pair: the last rank, as the Rust library's map
	}
	return m, nil
}
