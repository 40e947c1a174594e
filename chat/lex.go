package chat

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A lexer of Jinja2's: text and tags with Jinja2's whitespace control
// (trim_blocks and lstrip_blocks on, - and + markers), and the tokens of
// each tag, as jinja2/lexer.py reads them.

type pieceKind int

const (
	pieceText pieceKind = iota
	pieceExpr
	pieceStmt
)

// piece is text or a tag after Jinja2's whitespace control.
type piece struct {
	kind pieceKind
	text string  // pieceText
	toks []token // tags: the tokens between the delimiters
	line int
	// newlines in the source this piece stands for, delimiters and the
	// whitespace control took included.
	srcNewlines int
}

type tokKind int

const (
	tokSpace tokKind = iota
	tokName
	tokString
	tokNumber
	tokOp
)

type token struct {
	kind tokKind
	text string // as written
	str  string // tokString: the value
}

// SyntaxError is a template the lexer or parser refuses.
type SyntaxError struct {
	Line int
	Msg  string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("chat: template line %d: %s", e.Line, e.Msg) }

func syntaxErr(line int, format string, args ...any) error {
	return &SyntaxError{Line: line, Msg: fmt.Sprintf(format, args...)}
}

// lexTemplate splits src into text and tags with Jinja2's rules: newlines
// read as \n, one final newline dropped, trim_blocks and lstrip_blocks on.
func lexTemplate(src string) ([]piece, error) {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")

	var pieces []piece
	pos, line := 0, 1
	lineStarting := true
	addText := func(text string, covered string) {
		pieces = append(pieces, piece{kind: pieceText, text: text, line: line, srcNewlines: strings.Count(covered, "\n")})
		line += strings.Count(covered, "\n")
	}
	for pos < len(src) {
		i := tagStart(src, pos)
		if i < 0 {
			addText(src[pos:], src[pos:])
			break
		}
		kind := src[i+1]
		j := i + 2
		var sign byte
		if j < len(src) && (src[j] == '-' || src[j] == '+') {
			sign = src[j]
			j++
		}
		rawEnd, isRaw := 0, false
		if kind == '%' {
			rawEnd, isRaw = rawBegin(src, j)
		}
		data := src[pos:i]
		addText(stripBefore(data, sign, kind != '{', lineStarting), data)

		tagLine := line
		switch {
		case isRaw:
			// {% raw %} keeps the newline after it; the text up to
			// {% endraw %} is data with that tag's whitespace control.
			content, endSign, endStart, end, err := rawContent(src, rawEnd)
			if err != nil {
				return nil, syntaxErr(tagLine, "%v", err)
			}
			startsLine := strings.HasSuffix(src[i:rawEnd], "\n")
			tag := src[i:rawEnd]
			pieces = append(pieces, piece{kind: pieceText, text: "", line: line, srcNewlines: strings.Count(tag, "\n")})
			line += strings.Count(tag, "\n")
			addText(stripBefore(content, endSign, true, startsLine), content)
			tail := src[endStart:end]
			pieces = append(pieces, piece{kind: pieceText, text: "", line: line, srcNewlines: strings.Count(tail, "\n")})
			line += strings.Count(tail, "\n")
			lineStarting = strings.HasSuffix(tail, "\n")
			pos = end
		case kind == '#':
			end, ok := commentEnd(src, j)
			if !ok {
				return nil, syntaxErr(tagLine, "missing end of comment tag")
			}
			tag := src[i:end]
			pieces = append(pieces, piece{kind: pieceText, line: line, srcNewlines: strings.Count(tag, "\n")})
			line += strings.Count(tag, "\n")
			lineStarting = strings.HasSuffix(tag, "\n")
			pos = end
		default:
			toks, end, err := lexTag(src, j, kind == '%', tagLine)
			if err != nil {
				return nil, err
			}
			tag := src[i:end]
			k := pieceExpr
			if kind == '%' {
				k = pieceStmt
			}
			pieces = append(pieces, piece{kind: k, toks: toks, line: tagLine, srcNewlines: strings.Count(tag, "\n")})
			line += strings.Count(tag, "\n")
			lineStarting = strings.HasSuffix(tag, "\n")
			pos = end
		}
	}
	return pieces, nil
}

// tagStart is the index of the next "{{", "{%" or "{#" at or after pos, or -1.
func tagStart(src string, pos int) int {
	for {
		i := strings.IndexByte(src[pos:], '{')
		if i < 0 || pos+i+1 >= len(src) {
			return -1
		}
		pos += i
		if c := src[pos+1]; c == '{' || c == '%' || c == '#' {
			return pos
		}
		pos++
	}
}

// stripBefore applies a tag's whitespace control to the text before it: '-'
// strips all whitespace; otherwise a block or comment tag (lstrip_blocks)
// that starts its line takes the spaces and tabs before it, unless '+'.
func stripBefore(text string, sign byte, lstrip, lineStarting bool) string {
	if sign == '-' {
		return strings.TrimRightFunc(text, isPySpace)
	}
	if sign == '+' || !lstrip {
		return text
	}
	lpos := strings.LastIndexByte(text, '\n') + 1
	if lpos > 0 || lineStarting {
		rest := text[lpos:]
		if rest != "" && strings.TrimLeftFunc(rest, isPySpace) == "" {
			return text[:lpos]
		}
	}
	return text
}

// skipSpace is the index after the whitespace at pos.
func skipSpace(src string, pos int) int {
	for pos < len(src) {
		r, n := utf8.DecodeRuneInString(src[pos:])
		if !isPySpace(r) {
			break
		}
		pos += n
	}
	return pos
}

// rawBegin matches the rest of "{% raw %}" (or "{%- raw -%}") from pos, the
// whitespace control after "{%": it returns where the tag ends.
func rawBegin(src string, pos int) (int, bool) {
	p := skipSpace(src, pos)
	if !strings.HasPrefix(src[p:], "raw") {
		return 0, false
	}
	p = skipSpace(src, p+3)
	switch {
	case strings.HasPrefix(src[p:], "-%}"):
		return skipSpace(src, p+3), true
	case strings.HasPrefix(src[p:], "%}"):
		return p + 2, true
	}
	return 0, false
}

// rawContent finds "{% endraw %}" after a raw tag: the text before it, its
// whitespace sign, where it starts and where it ends (trim_blocks taking
// one newline).
func rawContent(src string, pos int) (content string, sign byte, start, end int, err error) {
	for p := pos; ; p++ {
		k := strings.Index(src[p:], "{%")
		if k < 0 {
			return "", 0, 0, 0, fmt.Errorf("missing end of raw directive")
		}
		p += k
		q := p + 2
		var s byte
		if q < len(src) && (src[q] == '-' || src[q] == '+') {
			s = src[q]
			q++
		}
		q = skipSpace(src, q)
		if !strings.HasPrefix(src[q:], "endraw") {
			continue
		}
		q = skipSpace(src, q+6)
		switch {
		case strings.HasPrefix(src[q:], "+%}"):
			return src[pos:p], s, p, q + 3, nil
		case strings.HasPrefix(src[q:], "-%}"):
			return src[pos:p], s, p, skipSpace(src, q+3), nil
		case strings.HasPrefix(src[q:], "%}"):
			e := q + 2
			if e < len(src) && src[e] == '\n' {
				e++
			}
			return src[pos:p], s, p, e, nil
		}
	}
}

// commentEnd is where a comment that opened before pos ends: "+#}", "-#}"
// and the whitespace after it, or "#}" and one newline.
func commentEnd(src string, pos int) (int, bool) {
	for p := pos; p < len(src); p++ {
		switch {
		case strings.HasPrefix(src[p:], "+#}"):
			return p + 3, true
		case strings.HasPrefix(src[p:], "-#}"):
			return skipSpace(src, p+3), true
		case strings.HasPrefix(src[p:], "#}"):
			if p+2 < len(src) && src[p+2] == '\n' {
				return p + 3, true
			}
			return p + 2, true
		}
	}
	return 0, false
}

// lexTag reads a block's or a variable's tokens from pos up to its end,
// which counts only with every bracket closed; it returns the tokens and
// where the tag (with the whitespace its end takes) ends.
func lexTag(src string, pos int, block bool, line int) ([]token, int, error) {
	var (
		toks  []token
		stack []byte
	)
	for {
		if pos >= len(src) {
			what := "variable"
			if block {
				what = "block"
			}
			return nil, 0, syntaxErr(line, "unexpected end of template inside a %s tag", what)
		}
		if len(stack) == 0 {
			rest := src[pos:]
			switch {
			case block && strings.HasPrefix(rest, "+%}"):
				return toks, pos + 3, nil
			case block && strings.HasPrefix(rest, "-%}"), !block && strings.HasPrefix(rest, "-}}"):
				return toks, skipSpace(src, pos+3), nil
			case block && strings.HasPrefix(rest, "%}"):
				end := pos + 2
				if end < len(src) && src[end] == '\n' {
					end++
				}
				return toks, end, nil
			case !block && strings.HasPrefix(rest, "}}"):
				return toks, pos + 2, nil
			}
		}
		t, n := lexToken(src[pos:])
		if n == 0 {
			r, _ := utf8.DecodeRuneInString(src[pos:])
			return nil, 0, syntaxErr(line, "unexpected char %q", r)
		}
		if t.kind == tokOp {
			switch t.text {
			case "(", "[", "{":
				if len(stack) >= maxNesting {
					return nil, 0, syntaxErr(line, "brackets nested deeper than %d", maxNesting)
				}
				stack = append(stack, map[string]byte{"(": ')', "[": ']', "{": '}'}[t.text])
			case ")", "]", "}":
				if len(stack) == 0 {
					return nil, 0, syntaxErr(line, "unexpected '%s'", t.text)
				}
				if want := stack[len(stack)-1]; want != t.text[0] {
					return nil, 0, syntaxErr(line, "unexpected '%s', expected '%c'", t.text, want)
				}
				stack = stack[:len(stack)-1]
			}
		}
		if t.kind == tokString {
			s, err := unescapeString(t.text[1 : len(t.text)-1])
			if err != nil {
				return nil, 0, syntaxErr(line, "%v", err)
			}
			t.str = s
		}
		toks = append(toks, t)
		line += strings.Count(t.text, "\n")
		pos += n
	}
}

// operators are Jinja2's, longest first.
var operators = []string{"**", "//", "==", "!=", ">=", "<=",
	"+", "-", "/", "*", "%", "~", "[", "]", "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"}

// lexToken reads one token in Jinja2's order: whitespace, float, integer,
// name, string, operator. n is 0 where none matches.
func lexToken(s string) (token, int) {
	r, _ := utf8.DecodeRuneInString(s)
	switch {
	case isPySpace(r):
		n := skipSpace(s, 0)
		return token{tokSpace, s[:n], ""}, n
	case r >= '0' && r <= '9':
		if n := floatLen(s); n > 0 {
			return token{tokNumber, s[:n], ""}, n
		}
		if n := intLen(s); n > 0 {
			return token{tokNumber, s[:n], ""}, n
		}
	case r == '_' || unicode.IsLetter(r):
		n := 0
		for n < len(s) {
			c, w := utf8.DecodeRuneInString(s[n:])
			if c != '_' && !unicode.IsLetter(c) && !unicode.IsDigit(c) && !unicode.Is(unicode.Mn, c) && !unicode.Is(unicode.Mc, c) {
				break
			}
			n += w
		}
		return token{tokName, s[:n], ""}, n
	case r == '\'' || r == '"':
		for i := 1; i < len(s); i++ {
			switch s[i] {
			case '\\':
				i++
			case byte(r):
				return token{tokString, s[:i+1], ""}, i + 1
			}
		}
		return token{}, 0
	}
	for _, op := range operators {
		if strings.HasPrefix(s, op) {
			return token{tokOp, op, ""}, len(op)
		}
	}
	return token{}, 0
}

// digitsLen is the length of a run of digits with single '_' between them.
func digitsLen(s string, isDigit func(byte) bool) int {
	n := 0
	for n < len(s) {
		if isDigit(s[n]) {
			n++
			continue
		}
		if s[n] == '_' && n > 0 && n+1 < len(s) && isDigit(s[n+1]) {
			n++
			continue
		}
		break
	}
	return n
}

func isDec(c byte) bool { return c >= '0' && c <= '9' }

// floatLen matches Jinja2's float: digits, then a fraction and an optional
// exponent, or an exponent.
func floatLen(s string) int {
	n := digitsLen(s, isDec)
	if n == 0 {
		return 0
	}
	frac := 0
	if n+1 < len(s) && s[n] == '.' && isDec(s[n+1]) {
		frac = 1 + digitsLen(s[n+1:], isDec)
	}
	e := n + frac
	if e < len(s) && (s[e] == 'e' || s[e] == 'E') {
		k := e + 1
		if k < len(s) && (s[k] == '+' || s[k] == '-') {
			k++
		}
		if d := digitsLen(s[k:], isDec); d > 0 {
			return k + d
		}
	}
	if frac > 0 {
		return e
	}
	return 0
}

// intLen matches Jinja2's integer: 0b, 0o, 0x or decimal.
func intLen(s string) int {
	if len(s) > 2 && s[0] == '0' {
		var isDigit func(byte) bool
		switch s[1] | 0x20 {
		case 'b':
			isDigit = func(c byte) bool { return c == '0' || c == '1' }
		case 'o':
			isDigit = func(c byte) bool { return c >= '0' && c <= '7' }
		case 'x':
			isDigit = func(c byte) bool { return isDec(c) || c|0x20 >= 'a' && c|0x20 <= 'f' }
		}
		if isDigit != nil {
			rest := s[2:]
			if rest[0] == '_' {
				rest = rest[1:]
			}
			if d := digitsLen(rest, isDigit); d > 0 {
				return len(s) - len(rest) + d
			}
		}
	}
	if s[0] == '0' {
		return digitsLen(s, func(c byte) bool { return c == '0' })
	}
	return digitsLen(s, isDec)
}

// unescapeString decodes a string literal's body as Python's
// unicode-escape codec does.
func unescapeString(s string) (string, error) {
	if !strings.Contains(s, "\\") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch e := s[i]; e {
		case '\n':
		case '\\', '\'', '"':
			b.WriteByte(e)
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			n, k := 0, 0
			for k < 3 && i+k < len(s) && s[i+k] >= '0' && s[i+k] <= '7' {
				n = n*8 + int(s[i+k]-'0')
				k++
			}
			b.WriteRune(rune(n))
			i += k - 1
		case 'x', 'u', 'U':
			size := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+1+size > len(s) {
				return "", fmt.Errorf("truncated \\%c escape", e)
			}
			n, err := strconv.ParseUint(s[i+1:i+1+size], 16, 32)
			if err != nil || n > unicode.MaxRune {
				return "", fmt.Errorf("invalid \\%c escape", e)
			}
			b.WriteRune(rune(n))
			i += size
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return b.String(), nil
}

// next is the index of the first token at or after i that is not space, or len(toks).
func next(toks []token, i int) int {
	for i < len(toks) && toks[i].kind == tokSpace {
		i++
	}
	return i
}

// prev is the index of the last token at or before i that is not space, or -1.
func prev(toks []token, i int) int {
	for i >= 0 && toks[i].kind == tokSpace {
		i--
	}
	return i
}

func isOp(toks []token, i int, op string) bool {
	return i >= 0 && i < len(toks) && toks[i].kind == tokOp && toks[i].text == op
}
