package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// maxDepth bounds the nesting of values a render accepts.
const maxDepth = 256

// toValue converts a Go value to the template's: nil, bool, numbers,
// strings, slices, maps with string keys (keys sorted), json.RawMessage
// (decoded keeping its key order) and json.Number; anything else goes
// through encoding/json (a struct keeps its field order). A whole float64
// (as encoding/json decodes every JSON number into any) becomes an int.
func toValue(v any) (jinja.Value, error) {
	return toValueDepth(v, 0)
}

func toValueDepth(v any, depth int) (jinja.Value, error) {
	if depth > maxDepth {
		return jinja.Undefined(), errors.New("value nested too deeply")
	}
	switch x := v.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(x), nil
	case string:
		return jinja.NewString(x), nil
	case int:
		return jinja.NewInt(int64(x)), nil
	case int8:
		return jinja.NewInt(int64(x)), nil
	case int16:
		return jinja.NewInt(int64(x)), nil
	case int32:
		return jinja.NewInt(int64(x)), nil
	case int64:
		return jinja.NewInt(x), nil
	case uint8:
		return jinja.NewInt(int64(x)), nil
	case uint16:
		return jinja.NewInt(int64(x)), nil
	case uint32:
		return jinja.NewInt(int64(x)), nil
	case float32:
		return floatValue(float64(x)), nil
	case float64:
		return floatValue(x), nil
	case json.Number:
		return numberValue(x)
	case json.RawMessage:
		return decodeJSON(x)
	case []any:
		items := make([]jinja.Value, len(x))
		for i, item := range x {
			iv, err := toValueDepth(item, depth+1)
			if err != nil {
				return jinja.Undefined(), err
			}
			items[i] = iv
		}
		return jinja.NewList(items), nil
	case map[string]any:
		return mapValue(x, depth)
	case Message:
		return mapValue(x, depth)
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer:
		if rv.IsNil() {
			return jinja.None(), nil
		}
		if rv.Elem().Kind() != reflect.Struct {
			return toValueDepth(rv.Elem().Interface(), depth+1)
		}
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return jinja.None(), nil
		}
		items := make([]jinja.Value, rv.Len())
		for i := range items {
			iv, err := toValueDepth(rv.Index(i).Interface(), depth+1)
			if err != nil {
				return jinja.Undefined(), err
			}
			items[i] = iv
		}
		return jinja.NewList(items), nil
	case reflect.Map:
		if rv.Type().Key().Kind() == reflect.String {
			if rv.IsNil() {
				return jinja.None(), nil
			}
			m := make(map[string]any, rv.Len())
			for it := rv.MapRange(); it.Next(); {
				m[it.Key().String()] = it.Value().Interface()
			}
			return mapValue(m, depth)
		}
	}
	data, err := json.Marshal(v)
	if err != nil {
		return jinja.Undefined(), fmt.Errorf("%T: %w", v, err)
	}
	return decodeJSON(data)
}

func mapValue(m map[string]any, depth int) (jinja.Value, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	d := jinja.NewDict()
	for _, k := range keys {
		kv, err := toValueDepth(m[k], depth+1)
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("%q: %w", k, err)
		}
		d.AsDict().Set(k, kv)
	}
	return d, nil
}

// floatValue keeps a whole float within ±2^53 as an int.
func floatValue(f float64) jinja.Value {
	if f == math.Trunc(f) && math.Abs(f) <= 1<<53 {
		return jinja.NewInt(int64(f))
	}
	return jinja.NewFloat(f)
}

// numberValue reads a JSON number as Python's json.loads does: an int
// without '.', 'e' or 'E', a float otherwise. An int past int64 becomes a
// float.
func numberValue(n json.Number) (jinja.Value, error) {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		if i, err := n.Int64(); err == nil {
			return jinja.NewInt(i), nil
		}
	}
	f, err := n.Float64()
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return jinja.Undefined(), fmt.Errorf("number %q: %w", s, err)
	}
	return jinja.NewFloat(f), nil
}

// decodeJSON decodes one JSON value, objects keeping their keys' order (a
// repeated key keeps its first place and its last value, as in Python).
func decodeJSON(data []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeJSONValue(dec, 0)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Undefined(), errors.New("invalid JSON: data after the value")
	}
	return v, nil
}

func decodeJSONValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxDepth {
		return jinja.Undefined(), errors.New("JSON nested too deeply")
	}
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return jinja.Undefined(), fmt.Errorf("invalid JSON: %w", err)
	}
	switch t := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		return numberValue(t)
	case json.Delim:
		switch t {
		case '[':
			items := []jinja.Value{}
			for dec.More() {
				v, err := decodeJSONValue(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Undefined(), fmt.Errorf("invalid JSON: %w", err)
			}
			return jinja.NewList(items), nil
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), fmt.Errorf("invalid JSON: %w", err)
				}
				key, ok := kt.(string)
				if !ok {
					return jinja.Undefined(), errors.New("invalid JSON: object key is not a string")
				}
				v, err := decodeJSONValue(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				d.AsDict().Set(key, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Undefined(), fmt.Errorf("invalid JSON: %w", err)
			}
			return d, nil
		}
	}
	return jinja.Undefined(), fmt.Errorf("invalid JSON: unexpected %v", tok)
}

// copyValue copies v's lists and dicts, which a template may change.
func copyValue(v jinja.Value) jinja.Value {
	switch {
	case v.IsList():
		items := make([]jinja.Value, v.AsList().Len())
		for i, it := range v.AsList().Items {
			items[i] = copyValue(it)
		}
		return jinja.NewList(items)
	case v.IsDict():
		d := jinja.NewDict()
		for _, k := range v.AsDict().Keys {
			d.AsDict().Set(k, copyValue(v.AsDict().Data[k]))
		}
		return d
	}
	return v
}

// decodeToolArguments replaces each tool call's function.arguments that is
// a JSON object in a string with the object, as vLLM does before rendering.
func decodeToolArguments(messages jinja.Value) {
	for _, m := range messages.AsList().Items {
		if !m.IsDict() {
			continue
		}
		calls, ok := m.AsDict().Get("tool_calls")
		if !ok || !calls.IsList() {
			continue
		}
		for _, c := range calls.AsList().Items {
			if !c.IsDict() {
				continue
			}
			f, ok := c.AsDict().Get("function")
			if !ok || !f.IsDict() {
				continue
			}
			a, ok := f.AsDict().Get("arguments")
			if !ok || !a.IsString() {
				continue
			}
			if v, err := decodeJSON([]byte(a.AsString())); err == nil && v.IsDict() {
				f.AsDict().Set("arguments", v)
			}
		}
	}
}
