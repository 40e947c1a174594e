package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// preTokenizer splits the text spans into words; spans that are added
// tokens pass through untouched.
type preTokenizer interface {
	preTokenize(in []span) ([]span, error)
}

type preSequence []preTokenizer

func (q preSequence) preTokenize(in []span) ([]span, error) {
	var err error
	for _, p := range q {
		if in, err = p.preTokenize(in); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// pattern is what a Split matches: a literal string, a regex, or (for the
// built-in pre-tokenizers) each character a predicate accepts.
type pattern struct {
	lit  string
	re   *regexp2.Regexp
	char func(rune) bool
}

// findAll lists the byte ranges of the pattern's non-overlapping matches.
func (p pattern) findAll(s string) [][2]int {
	var out [][2]int
	switch {
	case p.char != nil:
		for i, r := range s {
			if p.char(r) {
				out = append(out, [2]int{i, i + utf8.RuneLen(r)})
			}
		}
	case p.re != nil:
		idx, err := p.re.FindAllStringIndex(s, -1)
		if err != nil {
			return nil // only a match timeout fails, and none is set
		}
		out = make([][2]int, len(idx))
		for i, m := range idx {
			out[i] = [2]int{m[0], m[1]}
		}
	case p.lit != "":
		for off := 0; ; {
			k := strings.Index(s[off:], p.lit)
			if k < 0 {
				break
			}
			out = append(out, [2]int{off + k, off + k + len(p.lit)})
			off += k + len(p.lit)
		}
	}
	return out
}

// behavior is what a split does with the pattern's matches.
type behavior int

const (
	removed behavior = iota
	isolated
	mergedWithPrevious
	mergedWithNext
	contiguous
)

type segment struct {
	start, end int
	match      bool
}

// splitSpans splits every text span of in at the pattern, as the Rust
// library's NormalizedString::split does, dropping empty pieces.
func splitSpans(in []span, p pattern, invert bool, b behavior) []span {
	out := make([]span, 0, len(in)*2)
	for _, sp := range in {
		if sp.id >= 0 {
			out = append(out, sp)
			continue
		}
		for _, seg := range splitSegments(sp.text, p, invert, b) {
			if seg.end > seg.start {
				out = append(out, span{text: sp.text[seg.start:seg.end], id: -1, atStart: sp.atStart && seg.start == 0})
			}
		}
	}
	return out
}

func splitSegments(s string, p pattern, invert bool, b behavior) []segment {
	var segs []segment
	prev := 0
	for _, m := range p.findAll(s) {
		if m[0] > prev {
			segs = append(segs, segment{prev, m[0], invert})
		}
		segs = append(segs, segment{m[0], m[1], !invert})
		prev = m[1]
	}
	if prev < len(s) {
		segs = append(segs, segment{prev, len(s), invert})
	}
	switch b {
	case removed:
		k := 0
		for _, sg := range segs {
			if !sg.match {
				segs[k] = sg
				k++
			}
		}
		return segs[:k]
	case isolated:
		return segs
	case mergedWithPrevious:
		var out []segment
		prevMatch := false
		for _, sg := range segs {
			if sg.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = sg.end
			} else {
				out = append(out, segment{sg.start, sg.end, false})
			}
			prevMatch = sg.match
		}
		return out
	case mergedWithNext:
		var rev []segment
		prevMatch := false
		for i := len(segs) - 1; i >= 0; i-- {
			sg := segs[i]
			if sg.match && !prevMatch && len(rev) > 0 {
				rev[len(rev)-1].start = sg.start
			} else {
				rev = append(rev, segment{sg.start, sg.end, false})
			}
			prevMatch = sg.match
		}
		for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
			rev[i], rev[j] = rev[j], rev[i]
		}
		return rev
	default: // contiguous
		var out []segment
		prevMatch := false
		for _, sg := range segs {
			if sg.match == prevMatch && len(out) > 0 {
				out[len(out)-1].end = sg.end
			} else {
				out = append(out, segment{sg.start, sg.end, false})
			}
			prevMatch = sg.match
		}
		return out
	}
}

// split is the Split pre-tokenizer.
type split struct {
	pat    pattern
	invert bool
	b      behavior
}

func (s split) preTokenize(in []span) ([]span, error) {
	return splitSpans(in, s.pat, s.invert, s.b), nil
}

// gpt2Pattern is GPT-2's word pattern, which ByteLevel splits on when its
// use_regex is set.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// byteLevel maps every byte to GPT-2's printable alphabet, after an
// optional leading space and an optional split on GPT-2's pattern.
type byteLevel struct {
	addPrefixSpace bool
	re             *regexp2.Regexp // nil: no split
}

func (bl byteLevel) preTokenize(in []span) ([]span, error) {
	if bl.addPrefixSpace {
		for i := range in {
			if in[i].id < 0 && in[i].text != "" && !strings.HasPrefix(in[i].text, " ") {
				in[i].text = " " + in[i].text
			}
		}
	}
	if bl.re != nil {
		in = splitSpans(in, pattern{re: bl.re}, false, isolated)
	}
	for i := range in {
		if in[i].id < 0 {
			in[i].text = byteLevelString(in[i].text)
		}
	}
	return in, nil
}

// digits splits digits from the rest: each one alone or runs of them.
type digits struct{ individual bool }

func (d digits) preTokenize(in []span) ([]span, error) {
	b := contiguous
	if d.individual {
		b = isolated
	}
	return splitSpans(in, pattern{char: unicode.IsNumber}, false, b), nil
}

// metaspace replaces spaces with its replacement character, prepends one
// (always, or to the input's first piece only), and splits before each.
type metaspace struct {
	repl   string
	scheme string // "always", "first" or "never"
	split  bool
}

func (m metaspace) preTokenize(in []span) ([]span, error) {
	for i := range in {
		sp := &in[i]
		if sp.id >= 0 {
			continue
		}
		sp.text = strings.ReplaceAll(sp.text, " ", m.repl)
		if sp.text == "" {
			continue
		}
		if (m.scheme == "always" || m.scheme == "first" && sp.atStart) && !strings.HasPrefix(sp.text, m.repl) {
			sp.text = m.repl + sp.text
		}
	}
	if !m.split {
		return in, nil
	}
	return splitSpans(in, pattern{lit: m.repl}, false, mergedWithNext), nil
}

// whitespace keeps the runs of word characters and of other non-space
// characters (\w+|[^\w\s]+).
type whitespace struct{ re *regexp2.Regexp }

func (w whitespace) preTokenize(in []span) ([]span, error) {
	return splitSpans(in, pattern{re: w.re}, true, removed), nil
}

// whitespaceSplit splits on white space and drops it.
type whitespaceSplit struct{}

func (whitespaceSplit) preTokenize(in []span) ([]span, error) {
	return splitSpans(in, pattern{char: isWhiteSpace}, false, removed), nil
}

// punctuation splits punctuation characters from the rest.
type punctuation struct{ b behavior }

func (p punctuation) preTokenize(in []span) ([]span, error) {
	// Rust's is_ascii_punctuation (ASCII symbols included) or Unicode's P.
	isPunct := func(r rune) bool { return unicode.IsPunct(r) || r < utf8.RuneSelf && unicode.IsSymbol(r) }
	return splitSpans(in, pattern{char: isPunct}, false, p.b), nil
}
