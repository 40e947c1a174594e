package chat

import (
	"strconv"
	"strings"
)

// prepare lexes a template as Jinja2's lexer does and writes the source the
// library compiles, so that what the library does differently from Jinja2
// never shows:
//
//   - Whitespace: Jinja2 applies trim_blocks, lstrip_blocks and the - and +
//     markers to the text right beside a tag; the library reaches past
//     expressions to the nearest text, knows no +, and keeps a template's
//     final newline. prepare applies Jinja2's rules itself and hands every
//     piece of text to the library as a string literal, so the library has
//     no text left to trim.
//   - Literals: string escapes (\u00e9, \x1b, \r), numbers (1_000, 0x1f, 1e3)
//     are decoded as Python does and written in the forms the library reads.
//   - Python semantics: the library resolves its own filters and string
//     methods before anything a render passes in, so calls are routed to the
//     Python-faithful versions in pyfuncs.go, pystr.go and pyjson.go (the
//     library looks up a filter it does not know among the render's
//     variables):
//     x.split('a', 1) -> x|__moex_str_split('a', 1)
//     x|tojson -> x|__moex_tojson
//     {{ x }} -> {{ __moex_print((x)) }} (Python's str(x): None, 1.0, {'a': 1})
//   - Limits: each loop iteration checks the render's ctx and each macro
//     call counts its depth, through calls that print nothing.
//
// Comments pad the output so that each line keeps its number: the library's
// errors name the lines of the source as written. prepare also checks that
// blocks open and close in order (the library does not say where an unclosed
// block starts) and notes how the template uses a tool call's arguments.

const (
	internalPrefix = "__moex_"
	printFunc      = internalPrefix + "print"
	tickFunc       = internalPrefix + "tick"  // each loop iteration: ctx
	enterFunc      = internalPrefix + "enter" // each macro call: its depth
	leaveFunc      = internalPrefix + "leave"
	methodPrefix   = internalPrefix + "str_"
	filterPrefix   = internalPrefix
)

// maxNesting bounds nested blocks and brackets (CPython refuses more than
// 20 nested blocks in the code Jinja2 compiles to).
const maxNesting = 100

// pyMethods are the Python str methods whose calls go to pystr.go: the
// library's versions differ from Python's (split's maxsplit, startswith with
// a tuple, full case mapping, ...) or are missing (join, removeprefix, ...).
var pyMethods = map[string]bool{
	"strip": true, "lstrip": true, "rstrip": true,
	"split": true, "rsplit": true, "splitlines": true,
	"startswith": true, "endswith": true, "replace": true,
	"upper": true, "lower": true, "title": true, "capitalize": true,
	"join": true, "removeprefix": true, "removesuffix": true,
	"find": true, "rfind": true, "index": true, "rindex": true, "count": true,
	"isdigit": true, "isalpha": true, "isalnum": true, "isspace": true, "isupper": true, "islower": true,
}

// pyFilters are the Jinja filters replaced with Jinja2's (or transformers')
// behaviour.
var pyFilters = map[string]bool{
	"tojson": true, "title": true, "trim": true, "string": true,
	"upper": true, "lower": true, "capitalize": true, "join": true,
}

// source is a template's source prepared for the library.
type source struct {
	text string
	// argumentsAsString: the template concatenates a tool call's arguments
	// (+ or ~) and never tests their type, so they reach it as the JSON
	// string OpenAI sends (DeepSeek-V3's template) rather than decoded.
	argumentsAsString bool
}

// prepare lexes src and writes the library's source.
func prepare(src string) (source, error) {
	pieces, err := lexTemplate(src)
	if err != nil {
		return source{}, err
	}
	if err := checkBlocks(pieces); err != nil {
		return source{}, err
	}
	var (
		b   strings.Builder
		use argumentUse
	)
	for _, p := range pieces {
		var chunk string
		switch p.kind {
		case pieceText:
			if p.text != "" {
				chunk = "{{ " + literal(p.text, true) + " }}"
			}
		case pieceExpr:
			use.scan(p.toks)
			expr := strings.TrimSpace(emitTokens(p.toks))
			if expr == "" {
				return source{}, syntaxErr(p.line, "expected an expression in {{ }}")
			}
			chunk = "{{ " + printFunc + "((" + expr + ")) }}"
		case pieceStmt:
			use.scan(p.toks)
			chunk = "{% " + strings.TrimSpace(emitTokens(p.toks)) + " %}"
			switch keyword(p.toks) {
			case "for":
				chunk += "{{ " + tickFunc + "() }}"
			case "macro":
				chunk += "{{ " + enterFunc + "() }}"
			case "endmacro":
				chunk = "{{ " + leaveFunc + "() }}" + chunk
			}
		}
		b.WriteString(chunk)
		if pad := p.srcNewlines - strings.Count(chunk, "\n"); pad > 0 {
			b.WriteString("{#" + strings.Repeat("\n", pad) + "#}")
		}
	}
	return source{text: b.String(), argumentsAsString: use.concatenated && !use.typeTested}, nil
}

// literal is s as a string literal the library reads back as s; newlines
// stay as they are (text keeps its lines) or are escaped.
func literal(s string, rawNewlines bool) string {
	var b strings.Builder
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' || c == '\'':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c == '\n' && !rawNewlines:
			b.WriteString(`\n`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// emitTokens writes a tag's tokens for the library: literals in its forms,
// str methods and replaced filters routed to pystr.go and pyfuncs.go, and a
// space after each '}' so that a dict literal's end never reads as a tag's
// end.
func emitTokens(toks []token) string {
	var b strings.Builder
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		switch {
		case t.kind == tokString:
			b.WriteString(literal(t.str, false))
		case t.kind == tokNumber:
			b.WriteString(numberLiteral(t.text))
		case isOp(toks, i, ".") && i+1 < len(toks) && toks[i+1].kind == tokName && pyMethods[toks[i+1].text] &&
			isOp(toks, next(toks, i+2), "(") && isReceiverEnd(toks, prev(toks, i-1)):
			b.WriteString("|" + methodPrefix + toks[i+1].text)
			i++
		case isOp(toks, i, "|") && next(toks, i+1) < len(toks) && toks[next(toks, i+1)].kind == tokName &&
			pyFilters[toks[next(toks, i+1)].text]:
			j := next(toks, i+1)
			b.WriteString("|" + filterPrefix + toks[j].text)
			i = j
		case isOp(toks, i, "}"):
			b.WriteString("} ")
		default:
			b.WriteString(t.text)
		}
	}
	return b.String()
}

// numberLiteral writes a Jinja number (1_000, 0x1f, 1e3) as the library
// reads numbers: decimal digits, a float with a point.
func numberLiteral(s string) string {
	s = strings.ReplaceAll(s, "_", "")
	lower := strings.ToLower(s)
	if strings.ContainsAny(lower, ".e") && !strings.HasPrefix(lower, "0x") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return s
		}
		out := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.Contains(out, ".") {
			out += ".0"
		}
		return out
	}
	if n, err := strconv.ParseInt(s, 0, 64); err == nil {
		return strconv.FormatInt(n, 10)
	}
	return s
}

// blockEnds maps each block statement to its end tag.
var blockEnds = map[string]string{
	"if": "endif", "for": "endfor", "macro": "endmacro", "call": "endcall",
	"filter": "endfilter", "generation": "endgeneration", "set": "endset",
	"with": "endwith", "block": "endblock", "autoescape": "endautoescape",
}

// checkBlocks reports a block that is never closed, an end or else with no
// block, and break or continue outside a loop, naming the line.
func checkBlocks(pieces []piece) error {
	type open struct {
		keyword string
		line    int
	}
	var stack []open
	for _, p := range pieces {
		if p.kind != pieceStmt {
			continue
		}
		kw := keyword(p.toks)
		if len(stack) >= maxNesting {
			return syntaxErr(p.line, "blocks nested deeper than %d", maxNesting)
		}
		switch kw {
		case "":
			return syntaxErr(p.line, "expected a statement in {%% %%}")
		case "if", "for", "macro", "call", "filter", "generation", "with", "block", "autoescape":
			stack = append(stack, open{kw, p.line})
		case "set":
			if !hasOp(p.toks, "=") { // {% set x %}...{% endset %}
				stack = append(stack, open{kw, p.line})
			}
		case "elif":
			if len(stack) == 0 || stack[len(stack)-1].keyword != "if" {
				return syntaxErr(p.line, "{%% elif %%} outside an {%% if %%}")
			}
		case "else":
			if len(stack) == 0 || stack[len(stack)-1].keyword != "if" && stack[len(stack)-1].keyword != "for" {
				return syntaxErr(p.line, "{%% else %%} outside an {%% if %%} or {%% for %%}")
			}
		case "break", "continue":
			inLoop := false
			for _, o := range stack {
				inLoop = inLoop || o.keyword == "for"
			}
			if !inLoop {
				return syntaxErr(p.line, "{%% %s %%} outside a {%% for %%} loop", kw)
			}
		case "endraw":
			return syntaxErr(p.line, "{%% endraw %%} closes no {%% raw %%}")
		default:
			if !strings.HasPrefix(kw, "end") {
				continue
			}
			if len(stack) == 0 {
				return syntaxErr(p.line, "{%% %s %%} closes no block", kw)
			}
			top := stack[len(stack)-1]
			if want := blockEnds[top.keyword]; want != kw {
				return syntaxErr(p.line, "{%% %s %%} where the {%% %s %%} of line %d needs {%% %s %%}",
					kw, top.keyword, top.line, want)
			}
			stack = stack[:len(stack)-1]
		}
	}
	if len(stack) > 0 {
		top := stack[len(stack)-1]
		return syntaxErr(top.line, "{%% %s %%} is never closed (no {%% %s %%})", top.keyword, blockEnds[top.keyword])
	}
	return nil
}

// keyword is a statement's first word.
func keyword(toks []token) string {
	if i := next(toks, 0); i < len(toks) && toks[i].kind == tokName {
		return toks[i].text
	}
	return ""
}

func hasOp(toks []token, op string) bool {
	for i := range toks {
		if isOp(toks, i, op) {
			return true
		}
	}
	return false
}

// isReceiverEnd: a '.' after token i is attribute access.
func isReceiverEnd(toks []token, i int) bool {
	if i < 0 {
		return false
	}
	switch toks[i].kind {
	case tokName, tokString:
		return true
	case tokOp:
		return toks[i].text == ")" || toks[i].text == "]"
	}
	return false
}

// argumentUse records how a template reads a tool call's arguments.
type argumentUse struct {
	concatenated bool // an operand of + or ~
	typeTested   bool // tested with "is string" or "is mapping"
}

// scan looks at every .arguments and ['arguments'] in one tag's tokens.
func (u *argumentUse) scan(toks []token) {
	for i, t := range toks {
		var first, last int // the accessor's tokens
		switch {
		case t.kind == tokName && t.text == "arguments" && isOp(toks, i-1, "."):
			first, last = i-1, i
		case t.kind == tokString && t.str == "arguments" &&
			isOp(toks, prev(toks, i-1), "[") && isOp(toks, next(toks, i+1), "]"):
			first, last = prev(toks, i-1), next(toks, i+1)
		default:
			continue
		}
		if !isReceiverEnd(toks, prev(toks, first-1)) {
			continue
		}
		// Walk back over the receiver: names, strings, '.', [...] and (...).
		j := prev(toks, first-1)
		for j >= 0 {
			if toks[j].kind == tokName || toks[j].kind == tokString || isOp(toks, j, ".") {
				j = prev(toks, j-1)
				continue
			}
			if isOp(toks, j, "]") || isOp(toks, j, ")") {
				depth := 0
				for ; j >= 0; j-- {
					if toks[j].kind == tokOp {
						switch toks[j].text {
						case "]", ")":
							depth++
						case "[", "(":
							depth--
						}
					}
					if depth == 0 {
						break
					}
				}
				j = prev(toks, j-1)
				continue
			}
			break
		}
		after := next(toks, last+1)
		if isOp(toks, j, "+") || isOp(toks, j, "~") || isOp(toks, after, "+") || isOp(toks, after, "~") {
			u.concatenated = true
		}
		if after < len(toks) && toks[after].kind == tokName && toks[after].text == "is" {
			k := next(toks, after+1)
			if k < len(toks) && toks[k].text == "not" {
				k = next(toks, k+1)
			}
			if k < len(toks) && (toks[k].text == "string" || toks[k].text == "mapping") {
				u.typeTested = true
			}
		}
	}
}
