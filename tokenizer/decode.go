package tokenizer

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// decoder turns tokens back into text, a chain of steps over the list of
// token strings as in the Rust library (decode_chain); the results are
// concatenated.
type decoder interface {
	decode(tokens []string) []string
}

type decSequence []decoder

func (q decSequence) decode(tokens []string) []string {
	for _, d := range q {
		tokens = d.decode(tokens)
	}
	return tokens
}

// byteLevelDecoder maps GPT-2's alphabet back to bytes, taking a token
// with a character outside it as its own UTF-8, and writes the bytes as
// text with one U+FFFD per maximal invalid subsequence.
type byteLevelDecoder struct{}

func (byteLevelDecoder) decode(tokens []string) []string {
	var raw []byte
	for _, t := range tokens {
		var ok bool
		if raw, ok = byteLevelBytes(t, raw); !ok {
			raw = append(raw, t...)
		}
	}
	return []string{string(appendLossy(nil, raw))}
}

// byteFallback turns runs of <0xNN> tokens into their text; a run that is
// not valid UTF-8 becomes one U+FFFD per byte.
type byteFallback struct{}

func (byteFallback) decode(tokens []string) []string {
	out := make([]string, 0, len(tokens))
	var run []byte
	n := 0
	flush := func() {
		if n == 0 {
			return
		}
		if utf8.Valid(run) {
			out = append(out, string(run))
		} else {
			for range n {
				out = append(out, "\uFFFD")
			}
		}
		run, n = run[:0], 0
	}
	for _, t := range tokens {
		if b, ok := byteToken(t); ok {
			run = append(run, b)
			n++
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// byteToken reads a <0xNN> token.
func byteToken(t string) (byte, bool) {
	if len(t) != 6 || t[:3] != "<0x" || t[5] != '>' {
		return 0, false
	}
	v, err := strconv.ParseUint(t[3:5], 16, 8)
	return byte(v), err == nil
}

// fuse joins the tokens into one.
type fuse struct{}

func (fuse) decode(tokens []string) []string { return []string{strings.Join(tokens, "")} }

// stripDecoder removes up to start leading and stop trailing copies of
// content from each token.
type stripDecoder struct {
	content     rune
	start, stop int
}

func (s stripDecoder) decode(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		r := []rune(t)
		lo, hi := 0, len(r)
		for k := 0; k < s.start && lo < len(r) && r[lo] == s.content; k++ {
			lo++
		}
		for k := 0; k < s.stop && hi > lo && r[hi-1] == s.content; k++ {
			hi--
		}
		out[i] = string(r[lo:hi])
	}
	return out
}

// replaceDecoder rewrites each token's matches of a pattern.
type replaceDecoder struct{ r replace }

func (d replaceDecoder) decode(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = d.r.normalize(t)
	}
	return out
}

// metaspaceDecoder turns the replacement character back into spaces, and
// drops it from the first token (where the pre-tokenizer prepended one).
type metaspaceDecoder struct {
	repl        string
	stripPrefix bool
}

func (m metaspaceDecoder) decode(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		repl := " "
		if i == 0 && m.stripPrefix {
			repl = "" // the Rust library drops every one in the first token
		}
		out[i] = strings.ReplaceAll(t, m.repl, repl)
	}
	return out
}
