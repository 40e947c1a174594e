package arch

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// The classes of error a caller branches on (errors.Is).
var (
	// ErrUnknownFamily: a model_type (or GGUF architecture) moex does not
	// know.
	ErrUnknownFamily = errors.New("arch: unknown model family")
	// ErrDenseLayer: the layer asked for is a dense MLP layer, not MoE.
	ErrDenseLayer = errors.New("arch: dense layer")
)

// keys are one config.json object (the text model's, for a multimodal
// one) by key; a family's reader takes the keys its configuration class
// defines, by name. A value of the wrong JSON type is noted and makes the
// parse fail, naming the key; a missing size a family needs is noted as
// missing.
type keys struct {
	m       map[string]json.RawMessage
	missing []string
	bad     []string
}

func newKeys(data []byte) (*keys, error) {
	k := &keys{}
	if err := json.Unmarshal(data, &k.m); err != nil {
		return nil, err
	}
	return k, nil
}

// has reports whether key is present and not null.
func (k *keys) has(key string) bool { return !isNull(k.m[key]) }

// get decodes key into v when it is present and not null, reporting
// whether it was.
func (k *keys) get(key string, v any) bool {
	raw, ok := k.m[key]
	if !ok || isNull(raw) {
		return false
	}
	if err := json.Unmarshal(raw, v); err != nil {
		k.bad = append(k.bad, fmt.Sprintf("%s is %s: %v", key, raw, err))
		return false
	}
	return true
}

// Int is key as an integer; nil when it is missing or null.
func (k *keys) Int(key string) *int {
	var v int
	if !k.get(key, &v) {
		return nil
	}
	return &v
}

// Float is key as a number; nil when it is missing or null.
func (k *keys) Float(key string) *float64 {
	var v float64
	if !k.get(key, &v) {
		return nil
	}
	return &v
}

// Bool is key as a boolean; nil when it is missing or null.
func (k *keys) Bool(key string) *bool {
	var v bool
	if !k.get(key, &v) {
		return nil
	}
	return &v
}

// Str is key as a string; nil when it is missing or null.
func (k *keys) Str(key string) *string {
	var v string
	if !k.get(key, &v) {
		return nil
	}
	return &v
}

// Ints is key as a list of integers; nil when it is missing or null.
func (k *keys) Ints(key string) []int {
	var v []int
	k.get(key, &v)
	return v
}

// Strs is key as a list of strings; nil when it is missing or null.
func (k *keys) Strs(key string) []string {
	var v []string
	k.get(key, &v)
	return v
}

// Raw is key's JSON value, nil when it is missing.
func (k *keys) Raw(key string) json.RawMessage { return k.m[key] }

// need is key as an integer, or 0 with key noted as missing.
func (k *keys) need(key string) int {
	if p := k.Int(key); p != nil {
		return *p
	}
	if !k.has(key) {
		k.missing = append(k.missing, key)
	}
	return 0
}

// needAs is need for a size the family calls name in its messages.
func (k *keys) needAs(key, name string) int {
	if p := k.Int(key); p != nil {
		return *p
	}
	if !k.has(key) {
		k.missing = append(k.missing, name)
	}
	return 0
}

// or is key as an integer, or def when it is missing.
func (k *keys) or(key string, def int) int {
	if p := k.Int(key); p != nil {
		return *p
	}
	return def
}

// floatOr is key as a number, or def when it is missing.
func (k *keys) floatOr(key string, def float64) float64 {
	if p := k.Float(key); p != nil {
		return *p
	}
	return def
}

// boolOr is key as a boolean, or def when it is missing.
func (k *keys) boolOr(key string, def bool) bool {
	if p := k.Bool(key); p != nil {
		return *p
	}
	return def
}

// isNull reports whether a JSON value is absent or null.
func isNull(v json.RawMessage) bool {
	s := strings.TrimSpace(string(v))
	return s == "" || s == "null"
}

// boolOrMissing is *b as text, or "missing".
func boolOrMissing(b *bool) string {
	if b == nil {
		return "missing"
	}
	return fmt.Sprint(*b)
}
