package tokenizer

import (
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a piece of text before pre-tokenization.
type normalizer interface {
	normalize(s string) string
}

type normSequence []normalizer

func (q normSequence) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

// unicodeForm is NFC, NFD, NFKC or NFKD.
type unicodeForm struct{ f norm.Form }

func (u unicodeForm) normalize(s string) string { return u.f.String(s) }

type lowercase struct{}

func (lowercase) normalize(s string) string { return strings.ToLower(s) }

// prepend puts its string before a non-empty piece (SentencePiece's "▁").
type prepend struct{ s string }

func (p prepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return p.s + s
}

// replace rewrites every match of a string or regex pattern.
type replace struct {
	pat     pattern
	content string
}

func (r replace) normalize(s string) string {
	matches := r.pat.findAll(s)
	if len(matches) == 0 {
		return s
	}
	var b strings.Builder
	last := 0
	for _, m := range matches {
		b.WriteString(s[last:m[0]])
		b.WriteString(r.content)
		last = m[1]
	}
	b.WriteString(s[last:])
	return b.String()
}

// strip removes white space at either end.
type strip struct{ left, right bool }

func (st strip) normalize(s string) string {
	if st.left {
		s = strings.TrimLeftFunc(s, isWhiteSpace)
	}
	if st.right {
		s = strings.TrimRightFunc(s, isWhiteSpace)
	}
	return s
}

// stripAccents removes the marks (Mn, Mc, Me; after an NFD normalizer), as
// the Rust library does.
type stripAccents struct{}

func (stripAccents) normalize(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.Is(unicode.M, r) {
			return -1
		}
		return r
	}, s)
}

// isWhiteSpace is Unicode's White_Space property (Rust's char::is_whitespace).
func isWhiteSpace(r rune) bool { return unicode.Is(unicode.White_Space, r) }
