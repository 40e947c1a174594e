package chat

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

// Python's str methods, as templates call them (x.split(...) reaches
// strMethods through methodCall), and the case and whitespace rules they use.

// isPySpace is Python's str.isspace for one character.
func isPySpace(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f }

// pyUpper and pyLower are Python's full case mappings (ß -> SS).
func pyUpper(s string) string { return cases.Upper(language.Und).String(s) }

func pyLower(s string) string { return cases.Lower(language.Und).String(s) }

// pyTitle is Python's str.title: a cased character after an uncased one is
// titlecased, every other lowercased.
func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			b.WriteRune(unicode.ToLower(r))
		} else {
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r)
	}
	return b.String()
}

// pyCapitalize is Python's str.capitalize: the first character titlecased,
// the rest lowercased.
func pyCapitalize(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 {
		return s
	}
	return string(unicode.ToTitle(r)) + pyLower(s[n:])
}

// jinjaTitle is Jinja2's title filter: words start after '-', '(', '{',
// '[', '<' or whitespace; each is upper-cased first then lower-cased.
func jinjaTitle(s string) string {
	isSep := func(r rune) bool { return isPySpace(r) || strings.ContainsRune("-({[<", r) }
	var b strings.Builder
	for len(s) > 0 {
		r, _ := utf8.DecodeRuneInString(s)
		sep := isSep(r)
		end := strings.IndexFunc(s, func(r rune) bool { return isSep(r) != sep })
		if end < 0 {
			end = len(s)
		}
		word := s[:end]
		_, n := utf8.DecodeRuneInString(word)
		b.WriteString(pyUpper(word[:n]) + pyLower(word[n:]))
		s = s[end:]
	}
	return b.String()
}

// pyStrip strips chars (nil: whitespace) from the ends of s.
func pyStrip(s string, chars *string, left, right bool) string {
	cut := isPySpace
	if chars != nil {
		set := *chars
		cut = func(r rune) bool { return strings.ContainsRune(set, r) }
	}
	if left {
		s = strings.TrimLeftFunc(s, cut)
	}
	if right {
		s = strings.TrimRightFunc(s, cut)
	}
	return s
}

// pySplit is Python's str.split (or rsplit with fromRight).
func pySplit(s string, sep *string, maxsplit int, fromRight bool) ([]string, error) {
	if sep != nil {
		if *sep == "" {
			return nil, fmt.Errorf("empty separator")
		}
		if maxsplit < 0 {
			return strings.Split(s, *sep), nil
		}
		if !fromRight {
			return strings.SplitN(s, *sep, maxsplit+1), nil
		}
		var out []string
		for len(out) < maxsplit {
			i := strings.LastIndex(s, *sep)
			if i < 0 {
				break
			}
			out = append(out, s[i+len(*sep):])
			s = s[:i]
		}
		out = append(out, s)
		slices.Reverse(out)
		return out, nil
	}
	// Runs of whitespace separate; no empty strings; the rest after maxsplit
	// splits keeps its whitespace on the far side.
	if fromRight {
		var out []string
		for {
			s = strings.TrimRightFunc(s, isPySpace)
			if s == "" {
				break
			}
			if maxsplit >= 0 && len(out) == maxsplit {
				out = append(out, s)
				break
			}
			i := strings.LastIndexFunc(s, isPySpace)
			if i < 0 {
				out = append(out, s)
				break
			}
			_, w := utf8.DecodeRuneInString(s[i:])
			out = append(out, s[i+w:])
			s = s[:i]
		}
		slices.Reverse(out)
		return out, nil
	}
	out := []string{}
	for {
		s = strings.TrimLeftFunc(s, isPySpace)
		if s == "" {
			break
		}
		if maxsplit >= 0 && len(out) == maxsplit {
			out = append(out, s)
			break
		}
		i := strings.IndexFunc(s, isPySpace)
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	return out, nil
}

// pySplitlines is Python's str.splitlines.
func pySplitlines(s string, keepends bool) []string {
	out := []string{}
	for len(s) > 0 {
		i := strings.IndexFunc(s, func(r rune) bool {
			return r == '\n' || r == '\r' || r == '\v' || r == '\f' || r >= 0x1c && r <= 0x1e ||
				r == 0x85 || r == 0x2028 || r == 0x2029
		})
		if i < 0 {
			out = append(out, s)
			break
		}
		_, n := utf8.DecodeRuneInString(s[i:])
		if strings.HasPrefix(s[i:], "\r\n") {
			n = 2
		}
		if keepends {
			out = append(out, s[:i+n])
		} else {
			out = append(out, s[:i])
		}
		s = s[i+n:]
	}
	return out
}

// pySlice is s[start:end] over code points, as Python clamps it; ok is
// false when start lies past the end (startswith and endswith then fail).
func pySlice(s string, start, end jinja.Value) (string, bool) {
	if !given(start) && !given(end) {
		return s, true
	}
	runes := []rune(s)
	n := len(runes)
	idx := func(v jinja.Value, def int) int {
		if !given(v) {
			return def
		}
		i := int(v.AsInt())
		if i < 0 {
			i = max(0, i+n)
		}
		return i
	}
	lo, hi := idx(start, 0), min(idx(end, n), n)
	if lo > n {
		return "", false
	}
	if lo > hi {
		return "", true
	}
	return string(runes[lo:hi]), true
}

// optString is an optional str argument: nil when absent or None.
func optString(method string, v jinja.Value) (*string, error) {
	if !given(v) {
		return nil, nil
	}
	if !v.IsString() {
		return nil, fmt.Errorf("%s arg must be None or str, not %s", method, typeName(v))
	}
	s := v.AsString()
	return &s, nil
}

// optInt is an optional int argument.
func optInt(method string, v jinja.Value, def int) (int, error) {
	if !given(v) {
		return def, nil
	}
	if !v.IsInt() {
		return 0, fmt.Errorf("%s: %s object cannot be interpreted as an integer", method, typeName(v))
	}
	return int(v.AsInt()), nil
}

func stringList(items []string) jinja.Value {
	vals := make([]jinja.Value, len(items))
	for i, s := range items {
		vals[i] = jinja.NewString(s)
	}
	return jinja.NewList(vals)
}

// strMethod is a Python str method: the receiver, then the call's arguments.
type strMethod func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error)

var strMethods = map[string]strMethod{
	"strip":  stripMethod(true, true),
	"lstrip": stripMethod(true, false),
	"rstrip": stripMethod(false, true),
	"split":  splitMethod(false),
	"rsplit": splitMethod(true),
	"splitlines": func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		return stringList(pySplitlines(s, arg(args, kwargs, 0, "keepends").IsTruthy())), nil
	},
	"startswith": affixMethod("startswith", strings.HasPrefix),
	"endswith":   affixMethod("endswith", strings.HasSuffix),
	"replace": func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		old, repl := arg(args, kwargs, 0, "old"), arg(args, kwargs, 1, "new")
		if !old.IsString() || !repl.IsString() {
			return jinja.Undefined(), fmt.Errorf("replace() arguments must be str, not %s and %s", typeName(old), typeName(repl))
		}
		count, err := optInt("replace", arg(args, kwargs, 2, "count"), -1)
		if err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewString(strings.Replace(s, old.AsString(), repl.AsString(), count)), nil
	},
	"upper":      noArgs(pyUpper),
	"lower":      noArgs(pyLower),
	"title":      noArgs(pyTitle),
	"capitalize": noArgs(pyCapitalize),
	"join": func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		items, err := iterate(arg(args, kwargs, 0, "iterable"))
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("join: %w", err)
		}
		parts := make([]string, len(items))
		for i, it := range items {
			if !it.IsString() {
				return jinja.Undefined(), fmt.Errorf("sequence item %d: expected str instance, %s found", i, typeName(it))
			}
			parts[i] = it.AsString()
		}
		return jinja.NewString(strings.Join(parts, s)), nil
	},
	"removeprefix": func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		p := arg(args, kwargs, 0, "prefix")
		if !p.IsString() {
			return jinja.Undefined(), fmt.Errorf("removeprefix() argument must be str, not %s", typeName(p))
		}
		return jinja.NewString(strings.TrimPrefix(s, p.AsString())), nil
	},
	"removesuffix": func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		p := arg(args, kwargs, 0, "suffix")
		if !p.IsString() {
			return jinja.Undefined(), fmt.Errorf("removesuffix() argument must be str, not %s", typeName(p))
		}
		return jinja.NewString(strings.TrimSuffix(s, p.AsString())), nil
	},
	"find":   findMethod("find", false, false),
	"rfind":  findMethod("rfind", true, false),
	"index":  findMethod("index", false, true),
	"rindex": findMethod("rindex", true, true),
	"count": func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		sub := arg(args, kwargs, 0, "sub")
		if !sub.IsString() {
			return jinja.Undefined(), fmt.Errorf("count() argument must be str, not %s", typeName(sub))
		}
		in, ok, err := sliceArgs("count", s, args, kwargs)
		if err != nil || !ok {
			return jinja.NewInt(0), err
		}
		return jinja.NewInt(int64(strings.Count(in, sub.AsString()))), nil
	},
	"isdigit": classMethod(func(r rune) bool { return unicode.IsDigit(r) || unicode.Is(unicode.No, r) }),
	"isalpha": classMethod(unicode.IsLetter),
	"isalnum": classMethod(func(r rune) bool { return unicode.IsLetter(r) || unicode.IsNumber(r) }),
	"isspace": classMethod(isPySpace),
	"isupper": caseMethod(unicode.IsUpper, unicode.IsLower),
	"islower": caseMethod(unicode.IsLower, unicode.IsUpper),
}

func stripMethod(left, right bool) strMethod {
	return func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		chars, err := optString("strip", arg(args, kwargs, 0, "chars"))
		if err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewString(pyStrip(s, chars, left, right)), nil
	}
}

func splitMethod(fromRight bool) strMethod {
	return func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		sep, err := optString("split", arg(args, kwargs, 0, "sep"))
		if err != nil {
			return jinja.Undefined(), err
		}
		maxsplit, err := optInt("split", arg(args, kwargs, 1, "maxsplit"), -1)
		if err != nil {
			return jinja.Undefined(), err
		}
		parts, err := pySplit(s, sep, maxsplit, fromRight)
		if err != nil {
			return jinja.Undefined(), err
		}
		return stringList(parts), nil
	}
}

// affixMethod is startswith or endswith: a str or a tuple of them, then an
// optional start and end.
func affixMethod(name string, has func(s, affix string) bool) strMethod {
	return func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		for _, v := range []jinja.Value{arg(args, kwargs, 1, "start"), arg(args, kwargs, 2, "end")} {
			if given(v) && !v.IsInt() {
				return jinja.Undefined(), fmt.Errorf("%s: slice indices must be integers or None", name)
			}
		}
		sub, ok := pySlice(s, arg(args, kwargs, 1, "start"), arg(args, kwargs, 2, "end"))
		affix := arg(args, kwargs, 0, "prefix")
		var affixes []jinja.Value
		switch {
		case affix.IsString():
			affixes = []jinja.Value{affix}
		case affix.IsList():
			affixes = affix.AsList().Items
		default:
			return jinja.Undefined(), fmt.Errorf("%s first arg must be str or a tuple of str, not %s", name, typeName(affix))
		}
		for _, a := range affixes {
			if !a.IsString() {
				return jinja.Undefined(), fmt.Errorf("tuple for %s must only contain str, not %s", name, typeName(a))
			}
			if ok && has(sub, a.AsString()) {
				return jinja.NewBool(true), nil
			}
		}
		return jinja.NewBool(false), nil
	}
}

// sliceArgs is s[start:end] for a method's optional start and end
// (arguments 1 and 2); ok is false when start lies past the end.
func sliceArgs(name, s string, args []jinja.Value, kwargs map[string]jinja.Value) (string, bool, error) {
	start, end := arg(args, kwargs, 1, "start"), arg(args, kwargs, 2, "end")
	for _, v := range []jinja.Value{start, end} {
		if given(v) && !v.IsInt() {
			return "", false, fmt.Errorf("%s: slice indices must be integers or None", name)
		}
	}
	sub, ok := pySlice(s, start, end)
	return sub, ok, nil
}

// findMethod is find, rfind, index or rindex: the code-point index of sub
// in s[start:end], -1 or an error when it is not there.
func findMethod(name string, last, mustFind bool) strMethod {
	return func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		sub := arg(args, kwargs, 0, "sub")
		if !sub.IsString() {
			return jinja.Undefined(), fmt.Errorf("%s() argument must be str, not %s", name, typeName(sub))
		}
		in, ok, err := sliceArgs(name, s, args, kwargs)
		if err != nil {
			return jinja.Undefined(), err
		}
		i := -1
		if ok {
			if last {
				i = strings.LastIndex(in, sub.AsString())
			} else {
				i = strings.Index(in, sub.AsString())
			}
		}
		if i < 0 {
			if mustFind {
				return jinja.Undefined(), fmt.Errorf("substring not found")
			}
			return jinja.NewInt(-1), nil
		}
		offset := 0
		if start := arg(args, kwargs, 1, "start"); given(start) {
			offset = int(start.AsInt())
			if n := utf8.RuneCountInString(s); offset < 0 {
				offset = max(0, offset+n)
			}
		}
		return jinja.NewInt(int64(offset + utf8.RuneCountInString(in[:i]))), nil
	}
}

func noArgs(f func(string) string) strMethod {
	return func(s string, _ []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		return jinja.NewString(f(s)), nil
	}
}

// classMethod is an isX method: true when s is not empty and every character is of the class.
func classMethod(is func(rune) bool) strMethod {
	return func(s string, _ []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		return jinja.NewBool(s != "" && strings.IndexFunc(s, func(r rune) bool { return !is(r) }) < 0), nil
	}
}

// caseMethod is isupper or islower: some cased character, none of the other case.
func caseMethod(is, other func(rune) bool) strMethod {
	return func(s string, _ []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		return jinja.NewBool(strings.IndexFunc(s, is) >= 0 && strings.IndexFunc(s, other) < 0), nil
	}
}

// methodCall adapts a str method to the filter the rewritten source calls;
// count and index also take a list, as Python's list methods do.
func methodCall(name string, m strMethod) fn {
	return func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		if len(args) > 1 && args[0].IsList() && (name == "count" || name == "index") {
			n := 0
			for i, it := range args[0].AsList().Items {
				if it.Equals(args[1]) || it.IsNumber() && args[1].IsNumber() && toFloat(it) == toFloat(args[1]) {
					if name == "index" {
						return jinja.NewInt(int64(i)), nil
					}
					n++
				}
			}
			if name == "index" {
				return jinja.Undefined(), fmt.Errorf("%s is not in list", pyRepr(args[1]))
			}
			return jinja.NewInt(int64(n)), nil
		}
		if len(args) == 0 || !args[0].IsString() {
			recv := jinja.Undefined()
			if len(args) > 0 {
				recv = args[0]
			}
			return jinja.Undefined(), fmt.Errorf("'%s' object has no attribute '%s'", typeName(recv), name)
		}
		return m(args[0].AsString(), args[1:], kwargs)
	}
}

// toFloat is a number's value.
func toFloat(v jinja.Value) float64 {
	if v.IsInt() {
		return float64(v.AsInt())
	}
	return v.AsFloat()
}
