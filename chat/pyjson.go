package chat

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// transformers' tojson filter: Python's json.dumps.

// jsonOptions are json.dumps' arguments.
type jsonOptions struct {
	ensureASCII bool
	indent      *string // nil: one line
	itemSep     string
	keySep      string
	sortKeys    bool
}

// tojson is transformers' filter: json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False), arguments in that order.
func tojson(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), fmt.Errorf("tojson: no value")
	}
	x := args[0]
	rest := args[1:]
	opt := jsonOptions{itemSep: ", ", keySep: ": "}
	if v := arg(rest, kwargs, 0, "ensure_ascii"); given(v) {
		opt.ensureASCII = v.IsTruthy()
	}
	if v := arg(rest, kwargs, 1, "indent"); given(v) {
		var ind string
		switch {
		case v.IsInt():
			ind = strings.Repeat(" ", int(max(0, min(v.AsInt(), 1024))))
		case v.IsString():
			ind = v.AsString()
		default:
			return jinja.Undefined(), fmt.Errorf("tojson: indent must be an int or a string, not %s", typeName(v))
		}
		opt.indent = &ind
		opt.itemSep = ","
	}
	if v := arg(rest, kwargs, 2, "separators"); given(v) {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
			return jinja.Undefined(), fmt.Errorf("tojson: separators must be two strings")
		}
		opt.itemSep, opt.keySep = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
	}
	if v := arg(rest, kwargs, 3, "sort_keys"); given(v) {
		opt.sortKeys = v.IsTruthy()
	}
	var b strings.Builder
	if err := opt.encode(&b, x, 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(b.String()), nil
}

// encode writes v as json.dumps does.
func (o *jsonOptions) encode(b *strings.Builder, v jinja.Value, level int) error {
	switch {
	case v.IsNone():
		b.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		f := v.AsFloat()
		switch {
		case math.IsNaN(f):
			b.WriteString("NaN")
		case math.IsInf(f, 1):
			b.WriteString("Infinity")
		case math.IsInf(f, -1):
			b.WriteString("-Infinity")
		default:
			b.WriteString(pyFloat(f))
		}
	case v.IsString():
		o.encodeString(b, v.AsString())
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		sep := o.open(b, level+1)
		for i, item := range items {
			if i > 0 {
				b.WriteString(sep)
			}
			if err := o.encode(b, item, level+1); err != nil {
				return err
			}
		}
		o.close(b, level)
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if o.sortKeys {
			keys = slices.Clone(keys)
			sort.Strings(keys)
		}
		b.WriteByte('{')
		sep := o.open(b, level+1)
		for i, k := range keys {
			if i > 0 {
				b.WriteString(sep)
			}
			o.encodeString(b, k)
			b.WriteString(o.keySep)
			if err := o.encode(b, d.Data[k], level+1); err != nil {
				return err
			}
		}
		o.close(b, level)
		b.WriteByte('}')
	default:
		return fmt.Errorf("tojson: Object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

// open starts a container's items on a new line when indenting and returns
// the separator between items.
func (o *jsonOptions) open(b *strings.Builder, level int) string {
	if o.indent == nil {
		return o.itemSep
	}
	nl := "\n" + strings.Repeat(*o.indent, level)
	b.WriteString(nl)
	return o.itemSep + nl
}

func (o *jsonOptions) close(b *strings.Builder, level int) {
	if o.indent != nil {
		b.WriteString("\n" + strings.Repeat(*o.indent, level))
	}
}

// encodeString writes s as a JSON string: with ensure_ascii off only '"',
// '\\' and control characters are escaped, as Python does.
func (o *jsonOptions) encodeString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(b, `\u%04x`, r)
			case o.ensureASCII && r > 0x7e:
				if r > 0xffff {
					r -= 0x10000
					fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
				} else {
					fmt.Fprintf(b, `\u%04x`, r)
				}
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
