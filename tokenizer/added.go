package tokenizer

import (
	"sort"
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

// matcher finds added tokens; byFirst lists, per first byte, the indices of
// the tokens starting with it, longest first.
type matcher struct {
	tokens  []addedToken
	byFirst [256][]int
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
	a.raw.sort()
	a.norm.sort()
	return a
}

func (m *matcher) add(t addedToken) {
	m.byFirst[t.content[0]] = append(m.byFirst[t.content[0]], len(m.tokens))
	m.tokens = append(m.tokens, t)
}

func (m *matcher) sort() {
	for b := range m.byFirst {
		l := m.byFirst[b]
		sort.SliceStable(l, func(i, j int) bool { return len(m.tokens[l[i]].content) > len(m.tokens[l[j]].content) })
	}
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
		cands := m.byFirst[s[i]]
		if len(cands) == 0 {
			continue
		}
		var tok *addedToken
		for _, k := range cands {
			if strings.HasPrefix(s[i:], m.tokens[k].content) {
				tok = &m.tokens[k]
				break
			}
		}
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
