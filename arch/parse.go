package arch

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/moex-project/moex/format/safetensors"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/internal/regfile"
)

// maxConfigBytes bounds what is read of a config.json (DeepSeek-V3's is
// 2 KB).
const maxConfigBytes = 64 << 20

// Load reads a model's config.json, given its folder or the file: a
// regular file of at most 64 MiB.
func Load(path string) (*Config, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "config.json")
	}
	data, err := regfile.ReadFile(path, maxConfigBytes)
	if err != nil {
		return nil, fmt.Errorf("arch: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// Parse reads a Hugging Face config.json: the model's keys at the top
// level or, for a multimodal model, under text_config. Keys a family's
// configuration class gives a default take that default when missing; the
// sizes must be present. The MoE block is validated.
func Parse(data []byte) (*Config, error) {
	k, err := newKeys(data)
	if err != nil {
		return nil, fmt.Errorf("not a valid config.json: %w", err)
	}
	architectures := k.Strs("architectures")
	mt := ""
	if p := k.Str("model_type"); p != nil {
		mt = *p
	}
	if textConfig(mt) {
		raw := k.Raw("text_config")
		if isNull(raw) {
			return nil, fmt.Errorf("%s config.json has no text_config: the text model's fields are not there", mt)
		}
		text, err := newKeys(raw)
		if err != nil {
			return nil, fmt.Errorf("%s config.json: text_config: %w", mt, err)
		}
		// The text model's own model_type (qwen3_5_moe_text) names the same
		// family; a quantization_config may sit beside text_config.
		text.m["model_type"], _ = json.Marshal(mt)
		if !text.has("quantization_config") {
			text.m["quantization_config"] = k.Raw("quantization_config")
		}
		k = text
	}
	f, ok := familyOf(mt, k.Strs("architectures"))
	switch {
	case mt == "" && !ok:
		return nil, errkind.Errorf(ErrUnknownFamily, "config.json has no model_type (supported: %v, and %s)", Families(), aliasList())
	case !ok:
		return nil, errkind.Errorf(ErrUnknownFamily, "unknown model_type %q, architectures %v (supported: %v, and %s)", mt, k.Strs("architectures"), Families(), aliasList())
	}
	c := &Config{Family: f.name, Name: mt, Architectures: architectures, family: f,
		MoE: MoE{ModelType: f.name, Name: mt, RoutedScaling: 1, Scoring: Softmax, Method: Greedy}}
	if c.Name == "" {
		c.Name = f.name
		c.MoE.Name = f.name
	}
	c.Hidden = k.need("hidden_size")
	c.MoE.Hidden = c.Hidden
	c.Layers = k.or("num_hidden_layers", 0)
	if p := k.Int("num_hidden_layers"); p != nil && *p <= 0 {
		return nil, fmt.Errorf("num_hidden_layers is %d, must be positive", *p)
	}
	for _, key := range []string{"num_hidden_layers", "vocab_size"} {
		if !k.has(key) {
			c.Missing = append(c.Missing, key)
		}
	}
	c.Vocab = k.or("vocab_size", 0)
	c.ContextLength = k.or("max_position_embeddings", 0)
	c.NormEps = k.floatOr("rms_norm_eps", 1e-6)
	c.TiedEmbeddings = k.boolOr("tie_word_embeddings", false)
	c.DenseInter = k.or("intermediate_size", 0)
	c.readAttention(k)
	topK, name := f.topK, f.topKName
	if topK == nil {
		topK = []string{"num_experts_per_tok", "experts_per_token"}
	}
	if name == "" {
		name = "num_experts_per_tok"
	}
	for _, key := range topK {
		if p := k.Int(key); p != nil {
			c.MoE.TopK = *p
			break
		}
		if key == topK[len(topK)-1] {
			k.missing = append(k.missing, name)
		}
	}
	if err := f.read(c, k); err != nil {
		return nil, err
	}
	if len(k.bad) > 0 {
		return nil, fmt.Errorf("%s config.json: %s", f.name, strings.Join(k.bad, "; "))
	}
	if len(k.missing) > 0 {
		return nil, fmt.Errorf("%s config.json is missing %v", f.name, k.missing)
	}
	if q := k.Raw("quantization_config"); !isNull(q) {
		if c.Quant, err = safetensors.ParseQuantization(q); err != nil {
			return nil, err
		}
	}
	if c.MTPLayers < 0 {
		return nil, fmt.Errorf("num_nextn_predict_layers %d must not be negative", c.MTPLayers)
	}
	if err := c.MoE.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// readAttention reads the keys of grouped-query attention most families
// share (a family with another attention reads its own over them).
func (c *Config) readAttention(k *keys) {
	a := &c.Attention
	a.Kind = GQA
	a.Heads = k.or("num_attention_heads", 0)
	a.KVHeads = k.or("num_key_value_heads", a.Heads)
	a.HeadDim = k.or("head_dim", 0)
	if a.HeadDim == 0 && a.Heads > 0 {
		a.HeadDim = c.Hidden / a.Heads
	}
	a.Bias = k.boolOr("attention_bias", false)
	a.RoPE.Theta = k.floatOr("rope_theta", 10000)
	var s RoPEScaling
	if k.get("rope_scaling", &s) {
		if s.Type == "" {
			s.Type = s.RopeType
		}
		a.RoPE.Scaling = &s
	}
	a.RotaryDim = int(float64(a.HeadDim) * k.floatOr("partial_rotary_factor", 1))
	a.RotaryDim -= a.RotaryDim % 2
	if k.boolOr("use_sliding_window", true) {
		a.Window = k.or("sliding_window", 0)
	}
}
