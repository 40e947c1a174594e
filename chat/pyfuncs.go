package chat

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"
)

// Python's and Jinja2's semantics for what chat templates call and print:
// str(x) and repr(x), the filters source.go routes here, and the sandbox's
// range. pyjson.go has tojson, pystr.go the str methods.

// fn is a function as the library calls it: positional and keyword arguments.
type fn = func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error)

// arg is positional argument i, or keyword name, or Undefined.
func arg(args []jinja.Value, kwargs map[string]jinja.Value, i int, name string) jinja.Value {
	if i < len(args) {
		return args[i]
	}
	if v, ok := kwargs[name]; ok {
		return v
	}
	return jinja.Undefined()
}

// given reports whether an optional argument was passed and is not None.
func given(v jinja.Value) bool { return !v.IsUndefined() && !v.IsNone() }

// typeName is Python's name for v's type, for error messages.
func typeName(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return "Undefined"
	case v.IsNone():
		return "NoneType"
	case v.IsBool():
		return "bool"
	case v.IsInt():
		return "int"
	case v.IsFloat():
		return "float"
	case v.IsString():
		return "str"
	case v.IsList():
		return "list"
	case v.IsDict():
		return "dict"
	}
	return "function"
}

// pyStr is Python's str(v); Undefined prints as nothing, as in Jinja.
func pyStr(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return ""
	case v.IsString():
		return v.AsString()
	}
	return pyRepr(v)
}

// pyRepr is Python's repr(v).
func pyRepr(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return "Undefined"
	case v.IsNone():
		return "None"
	case v.IsBool():
		if v.AsBool() {
			return "True"
		}
		return "False"
	case v.IsInt():
		return strconv.FormatInt(v.AsInt(), 10)
	case v.IsFloat():
		return pyFloat(v.AsFloat())
	case v.IsString():
		return pyReprString(v.AsString())
	case v.IsList():
		var b strings.Builder
		b.WriteByte('[')
		for i, item := range v.AsList().Items {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyRepr(item))
		}
		b.WriteByte(']')
		return b.String()
	case v.IsDict():
		d := v.AsDict()
		var b strings.Builder
		b.WriteByte('{')
		for i, k := range d.Keys {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyReprString(k))
			b.WriteString(": ")
			b.WriteString(pyRepr(d.Data[k]))
		}
		b.WriteByte('}')
		return b.String()
	}
	return "<function " + v.AsCallable().Name + ">"
}

// pyReprString quotes s as Python's repr does: single quotes unless s holds
// a single quote and no double quote.
func pyReprString(s string) string {
	quote := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		quote = '"'
	}
	var b strings.Builder
	b.WriteByte(quote)
	for _, r := range s {
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r < 0x7f || unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xff:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte(quote)
	return b.String()
}

// pyFloat is Python's repr of a float: the shortest digits that read back,
// positional from 1e-4 up to 1e16, with ".0" on whole numbers.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // -d.ddde±XX
	sign := ""
	if s[0] == '-' {
		sign, s = "-", s[1:]
	}
	mant, expText, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expText)
	digits := strings.Replace(mant, ".", "", 1)
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}

// iterate lists what a for loop over v visits: a list's items, a string's
// characters, a dict's keys; Undefined is empty.
func iterate(v jinja.Value) ([]jinja.Value, error) {
	switch {
	case v.IsUndefined():
		return nil, nil
	case v.IsList():
		return v.AsList().Items, nil
	case v.IsString():
		var out []jinja.Value
		for _, r := range v.AsString() {
			out = append(out, jinja.NewString(string(r)))
		}
		return out, nil
	case v.IsDict():
		var out []jinja.Value
		for _, k := range v.AsDict().Keys {
			out = append(out, jinja.NewString(k))
		}
		return out, nil
	}
	return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
}

// stringFilter is a Jinja filter that reads its input as str(x).
func stringFilter(f func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error)) fn {
	return func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 {
			return jinja.NewString(""), nil
		}
		return f(pyStr(args[0]), args[1:], kwargs)
	}
}

// filters are the Jinja filters the rewritten source calls instead of the
// library's.
var filters = map[string]fn{
	"tojson": tojson,
	"title": stringFilter(func(s string, _ []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		return jinja.NewString(jinjaTitle(s)), nil
	}),
	"trim": stringFilter(func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		return strMethods["strip"](s, args, kwargs)
	}),
	"string": stringFilter(func(s string, _ []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		return jinja.NewString(s), nil
	}),
	"upper": stringFilter(func(s string, _ []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		return jinja.NewString(pyUpper(s)), nil
	}),
	"lower": stringFilter(func(s string, _ []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		return jinja.NewString(pyLower(s)), nil
	}),
	"capitalize": stringFilter(func(s string, _ []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		return jinja.NewString(pyCapitalize(s)), nil
	}),
	"join": join,
}

// join is Jinja2's join filter: join(value, d=”, attribute=None).
func join(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	items, err := iterate(args[0])
	if err != nil {
		return jinja.Undefined(), fmt.Errorf("join: %w", err)
	}
	sep := arg(args[1:], kwargs, 0, "d")
	attr := arg(args[1:], kwargs, 1, "attribute")
	parts := make([]string, len(items))
	for i, it := range items {
		if given(attr) {
			it = attribute(it, pyStr(attr))
		}
		parts[i] = pyStr(it)
	}
	return jinja.NewString(strings.Join(parts, pyStr(sep))), nil
}

// attribute is Jinja's attribute lookup for filters: a dotted path of keys
// and list indexes.
func attribute(v jinja.Value, path string) jinja.Value {
	for part := range strings.SplitSeq(path, ".") {
		switch {
		case v.IsDict():
			x, ok := v.AsDict().Get(part)
			if !ok {
				return jinja.Undefined()
			}
			v = x
		case v.IsList():
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= v.AsList().Len() {
				return jinja.Undefined()
			}
			v = v.AsList().Items[i]
		default:
			return jinja.Undefined()
		}
	}
	return v
}

// maxRange is the sandbox's limit on range().
const maxRange = 100000

// safeRange is the sandboxed environment's range: Python's range, refused
// past maxRange items.
func safeRange(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	nums := make([]int64, len(args))
	for i, a := range args {
		switch {
		case a.IsInt():
			nums[i] = a.AsInt()
		case a.IsBool() && a.AsBool():
			nums[i] = 1
		case a.IsBool():
			nums[i] = 0
		default:
			return jinja.Undefined(), fmt.Errorf("range: '%s' object cannot be interpreted as an integer", typeName(a))
		}
	}
	var start, stop, step int64 = 0, 0, 1
	switch len(nums) {
	case 1:
		stop = nums[0]
	case 2:
		start, stop = nums[0], nums[1]
	case 3:
		start, stop, step = nums[0], nums[1], nums[2]
	default:
		return jinja.Undefined(), fmt.Errorf("range expected 1 to 3 arguments, got %d", len(nums))
	}
	if step == 0 {
		return jinja.Undefined(), fmt.Errorf("range() arg 3 must not be zero")
	}
	var n int64
	switch {
	case step > 0 && stop > start:
		n = (stop - start + step - 1) / step
	case step < 0 && stop < start:
		n = (start - stop - step - 1) / -step
	}
	if n > maxRange {
		return jinja.Undefined(), fmt.Errorf("Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", maxRange)
	}
	items := make([]jinja.Value, n)
	for i := range items {
		items[i] = jinja.NewInt(start + int64(i)*step)
	}
	return jinja.NewList(items), nil
}
