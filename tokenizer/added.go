package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens.
type addedToken struct {
	id         int32
	content    string
	special    bool
	lstrip     bool // eats the white space before it
	rstrip     bool // eats the white space after it
	singleWord bool // matches only between word boundaries
	normalized bool // matched on the normalized text rather than the raw one
}

// addedVocab matches added tokens in text, leftmost first and longest among
// those starting at one place (the Rust library's Aho-Corasick
// LeftmostLongest), in two passes: the tokens not normalized on the raw
// text, then the normalized ones on the normalized pieces.
type addedVocab struct {
	tokens    []addedToken
	byContent map[string]int32
	raw, norm matcher
}

func newAddedVocab(tokens []addedToken) *addedVocab {
	a := &addedVocab{tokens: tokens, byContent: make(map[string]int32, len(tokens))}
	for _, t := range tokens {
		a.byContent[t.content] = t.id
		if t.content == "" {
			continue
		}
		if t.normalized {
			a.norm.add(t)
		} else {
			a.raw.add(t)
		}
	}
	return a
}

// matcher finds added tokens with a byte trie: from each position, the
// longest token that starts there, in steps of one byte.
type matcher struct {
	tokens []addedToken
	next   map[uint64]int32 // node<<8 | byte → node
	term   []int32          // node → the index of the token ending there, -1
}

func (m *matcher) add(t addedToken) {
	if m.next == nil {
		m.next, m.term = map[uint64]int32{}, []int32{-1}
	}
	node := int32(0)
	for i := 0; i < len(t.content); i++ {
		k := uint64(node)<<8 | uint64(t.content[i])
		nx, ok := m.next[k]
		if !ok {
			nx = int32(len(m.term))
			m.next[k] = nx
			m.term = append(m.term, -1)
		}
		node = nx
	}
	if m.term[node] < 0 { // the first of two equal contents wins
		m.term[node] = int32(len(m.tokens))
	}
	m.tokens = append(m.tokens, t)
}

// longest is the longest token starting at s[i:], or nil.
func (m *matcher) longest(s string, i int) *addedToken {
	node, best := int32(0), int32(-1)
	for j := i; j < len(s); j++ {
		nx, ok := m.next[uint64(node)<<8|uint64(s[j])]
		if !ok {
			break
		}
		node = nx
		if m.term[node] >= 0 {
			best = m.term[node]
		}
	}
	if best < 0 {
		return nil
	}
	return &m.tokens[best]
}

// split cuts the text spans of in at the added tokens of one pass
// (normalized: the second pass).
func (a *addedVocab) split(in []span, normalized bool) []span {
	m := &a.raw
	if normalized {
		m = &a.norm
	}
	if len(m.tokens) == 0 {
		return in
	}
	var out []span
	for _, sp := range in {
		if sp.id >= 0 {
			out = append(out, sp)
			continue
		}
		out = m.splitText(sp, out)
	}
	return out
}

func (m *matcher) splitText(sp span, out []span) []span {
	s := sp.text
	done := 0 // the end of the last token taken
	for i := 0; i < len(s); i++ {
		tok := m.longest(s, i)
		if tok == nil {
			continue
		}
		start, stop := i, i+len(tok.content)
		if tok.singleWord && (endsWithWord(s[:start]) || startsWithWord(s[stop:])) {
			i = stop - 1 // the search goes on after the match, as Aho-Corasick's does
			continue
		}
		if tok.lstrip {
			start = max(len(strings.TrimRightFunc(s[:start], isWhiteSpace)), done)
		}
		if tok.rstrip {
			stop = len(s) - len(strings.TrimLeftFunc(s[stop:], isWhiteSpace))
		}
		if start > done {
			out = append(out, span{text: s[done:start], id: -1, atStart: sp.atStart && done == 0})
		}
		out = append(out, span{text: s[start:stop], id: tok.id})
		done = stop
		i = stop - 1
	}
	if done < len(s) || len(s) == 0 {
		out = append(out, span{text: s[done:], id: -1, atStart: sp.atStart && done == 0})
	}
	return out
}

func isWordChar(r rune) bool { return unicode.IsLetter(r) || unicode.IsNumber(r) || r == '_' }

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordChar(r)
}
