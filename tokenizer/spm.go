package tokenizer

import (
	"container/heap"
	"unicode/utf8"
)

// spm is SentencePiece's BPE as llama.cpp runs a GGUF "llama" vocabulary:
// a word's characters merged pair by pair, at each step the adjacent pair
// whose concatenation is a token of the highest score (the leftmost among
// equals); a character outside the vocabulary becomes its bytes' <0xNN>
// tokens, or the unknown token.
type spm struct {
	vocab   map[string]int32
	scores  []float32
	byteIDs [256]int32
	unk     int32
}

type spmSymbol struct {
	start, end int // the symbol's bytes in the word
	prev, next int
}

type bigram struct {
	left, right int
	score       float32
	size        int // bytes of the merged text, to tell a stale entry
}

type bigrams []bigram

func (q bigrams) Len() int { return len(q) }
func (q bigrams) Less(i, j int) bool {
	if q[i].score != q[j].score {
		return q[i].score > q[j].score
	}
	return q[i].left < q[j].left
}
func (q bigrams) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *bigrams) Push(x any)   { *q = append(*q, x.(bigram)) }
func (q *bigrams) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

func (m *spm) tokenize(word string, out []int32) []int32 {
	syms := make([]spmSymbol, 0, len(word))
	for i, r := range word {
		syms = append(syms, spmSymbol{start: i, end: i + utf8.RuneLen(r), prev: len(syms) - 1, next: len(syms) + 1})
	}
	if len(syms) == 0 {
		return out
	}
	syms[len(syms)-1].next = -1
	var q bigrams
	try := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		text := word[syms[l].start:syms[r].end]
		if id, ok := m.vocab[text]; ok {
			heap.Push(&q, bigram{left: l, right: r, score: m.scores[id], size: len(text)})
		}
	}
	for i := 1; i < len(syms); i++ {
		try(i-1, i)
	}
	for q.Len() > 0 {
		b := heap.Pop(&q).(bigram)
		l, r := &syms[b.left], &syms[b.right]
		if l.end == l.start || r.end == r.start || l.next != b.right || r.end-l.start != b.size {
			continue // stale: one side has merged since
		}
		l.end = r.end
		r.start = r.end // emptied
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		try(l.prev, b.left)
		try(b.left, l.next)
	}
	for i := 0; i >= 0; i = syms[i].next {
		text := word[syms[i].start:syms[i].end]
		if id, ok := m.vocab[text]; ok {
			out = append(out, id)
			continue
		}
		// Only a single character can be outside the vocabulary.
		known := true
		for k := 0; k < len(text); k++ {
			known = known && m.byteIDs[text[k]] >= 0
		}
		if known {
			for k := 0; k < len(text); k++ {
				out = append(out, m.byteIDs[text[k]])
			}
		} else if m.unk >= 0 {
			out = append(out, m.unk)
		}
	}
	return out
}
