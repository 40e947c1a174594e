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

// FromGGUF is the Config a GGUF model's metadata describes (its first
// file's; the tensors may be in any shard). The metadata is mapped onto the
// config.json keys of the family llama.cpp converted it from
// (convert_hf_to_gguf.py writes the keys, llama-model.cpp reads them; each
// family file says which) and read by Parse: one definition of each family
// serves both formats.
func FromGGUF(g *gguf.Model) (*Config, error) {
	h, path, hasTensor := g.Header(), g.Path(), g.HasSuffix
	a := h.Metadata["general.architecture"].Str
	if a == "" {
		return nil, errkind.Errorf(gguf.ErrMalformed, "arch: gguf: %s: no general.architecture", path)
	}
	m := &ggufMeta{h: h, arch: a, path: path, hasTensor: hasTensor, hasExact: g.Has}
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
	m.wholeKeys(cfg)
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
	c.GGUF = true
	c.Attention.RoPEPairs = a == "llama" // convert_hf_to_gguf.py permutes LlamaModel's q and k
	if c.Attention.RoPE.Scaling != nil && c.Attention.RoPE.Scaling.Type == "yarn" {
		t := true // ggml's yarn rounds the ramp's bounds (ggml_rope_yarn_corr_dims)
		c.Attention.RoPE.Scaling.Truncate = &t
	}
	return c, nil
}

// wholeKeys writes the config.json keys of a whole model that the
// metadata gives (llama.cpp's llama-model.cpp reads them): the attention's
// heads, widths and window, the norms' epsilon, RoPE's base and scaling,
// the vocabulary, and tied embeddings (no output tensor). A file of MoE
// blocks only may lack them; a whole model then says which it needs.
func (m *ggufMeta) wholeKeys(cfg map[string]any) {
	for key, hf := range map[string]string{"attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
		"attention.key_length": "head_dim", "attention.layer_norm_rms_epsilon": "rms_norm_eps", "rope.freq_base": "rope_theta",
		"attention.sliding_window": "sliding_window", "vocab_size": "vocab_size", "context_length": "max_position_embeddings"} {
		if m.has(key) {
			cfg[hf] = m.num(key)
		}
	}
	if _, ok := cfg["intermediate_size"]; !ok && m.has("feed_forward_length") {
		cfg["intermediate_size"] = m.num("feed_forward_length") // the dense layers' MLP
	}
	if _, ok := cfg["vocab_size"]; !ok {
		if t, ok := m.h.Metadata["tokenizer.ggml.tokens"]; ok && t.Type == gguf.Array {
			cfg["vocab_size"] = len(t.Array)
		}
	}
	if m.has("rope.scaling.type") {
		s := map[string]any{"rope_type": m.h.Metadata[m.arch+".rope.scaling.type"].Str, "factor": m.num("rope.scaling.factor", 1),
			"original_max_position_embeddings": m.num("rope.scaling.original_context_length", 0),
			"beta_fast":                        m.num("rope.scaling.yarn_beta_fast", 32), "beta_slow": m.num("rope.scaling.yarn_beta_slow", 1)}
		if m.has("rope.scaling.yarn_log_multiplier") {
			// llama.cpp's deepseek2: cos and sin unscaled, the softmax scale
			// times (1 + log_mul·ln factor)²: DeepSeek's yarn with mscale =
			// mscale_all_dim = log_mul / 0.1.
			ms := m.num("rope.scaling.yarn_log_multiplier") / 0.1
			s["mscale"], s["mscale_all_dim"] = ms, ms
		}
		cfg["rope_scaling"] = s
	}
	cfg["tie_word_embeddings"] = !m.hasExact("output.weight")
}

// ggufMeta reads one architecture's metadata keys (ARCH.key), noting the
// missing and malformed ones.
type ggufMeta struct {
	h            *gguf.Header
	arch, path   string
	hasTensor    func(suffix string) bool
	hasExact     func(name string) bool
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
