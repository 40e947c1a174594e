package arch

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/moex-project/moex/format/gguf"
	"github.com/moex-project/moex/internal/errkind"
)

// FromGGUF is the Config a GGUF model's metadata describes (h: its first
// file's header; hasTensor reports whether any of its files holds a tensor
// whose name ends in a suffix). The metadata is mapped onto the config.json
// keys of the family llama.cpp converted it from (convert_hf_to_gguf.py
// writes the keys, llama-model.cpp reads them; each family file says which)
// and read by Parse: one definition of each family serves both formats.
func FromGGUF(h *gguf.Header, path string, hasTensor func(suffix string) bool) (*Config, error) {
	a := h.Metadata["general.architecture"].Str
	if a == "" {
		return nil, errkind.Errorf(gguf.ErrMalformed, "arch: gguf: %s: no general.architecture", path)
	}
	m := &ggufMeta{h: h, arch: a, path: path, hasTensor: hasTensor}
	// block_count counts the multi-token-prediction layers llama.cpp
	// stores after the model's (nextn_predict_layers: GLM-4.5, DeepSeek-V3.2).
	m.nextn = m.num("nextn_predict_layers", 0)
	cfg := map[string]any{"hidden_size": m.num("embedding_length"), "num_hidden_layers": m.num("block_count") - m.nextn}
	var f *family
	for _, x := range registry {
		if slices.Contains(x.gguf, a) {
			f = x
		}
	}
	if f == nil {
		var known []string
		for _, x := range registry {
			known = append(known, x.gguf...)
		}
		return nil, errkind.Errorf(ErrUnknownFamily, "arch: %s: GGUF architecture %q: moex reads %s", path, a, strings.Join(known, ", "))
	}
	if err := f.fromGGUF(m, cfg); err != nil {
		return nil, err
	}
	if len(m.bad) > 0 {
		return nil, errkind.Errorf(gguf.ErrMalformed, "arch: gguf: %s: %s", path, strings.Join(m.bad, "; "))
	}
	if len(m.missing) > 0 {
		return nil, errkind.Errorf(gguf.ErrMalformed, "arch: gguf: %s: the %s block needs %s", path, a, strings.Join(m.missing, ", "))
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, errkind.Errorf(gguf.ErrMalformed, "arch: gguf: %s: %v", path, err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("arch: %s: %w", path, err)
	}
	return c, nil
}

// ggufMeta reads one architecture's metadata keys (ARCH.key), noting the
// missing and malformed ones.
type ggufMeta struct {
	h            *gguf.Header
	arch, path   string
	hasTensor    func(suffix string) bool
	nextn        float64
	missing, bad []string
}

// has reports whether the file has ARCH.key.
func (m *ggufMeta) has(key string) bool {
	_, ok := m.h.Metadata[m.arch+"."+key]
	return ok
}

// num is ARCH.key as a number (a bool as 0 or 1), or def when it is
// missing; with no def, a missing key is noted.
func (m *ggufMeta) num(key string, def ...float64) float64 {
	v, ok := m.h.Metadata[m.arch+"."+key]
	if f, isNum := v.AsFloat(); ok && isNum {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			m.bad = append(m.bad, fmt.Sprintf("%s.%s is %v", m.arch, key, f))
		}
		return f
	}
	if ok && v.Type == gguf.Bool {
		if v.Bool {
			return 1
		}
		return 0
	}
	if ok {
		m.bad = append(m.bad, fmt.Sprintf("%s.%s is a %s, not a number", m.arch, key, v.Type))
		return 0
	}
	if len(def) > 0 {
		return def[0]
	}
	m.missing = append(m.missing, m.arch+"."+key)
	return 0
}
