package moetest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/moex-project/moex/internal/stwrite"
)

// WholeSpec describes a random whole DeepSeek-V2/V3 decoder model: token
// embedding, Layers decoder layers (MLA attention, then a dense MLP below
// FirstKDense and a MoE block from there on), a final RMSNorm and lm_head.
// MoE is the template of every MoE layer (its Hidden, Layer, NumLayers and
// FirstKDense are set here), Attn of every attention block (Hidden and
// Layer set here). DType is MoE.DType for every tensor (F32 or BF16).
type WholeSpec struct {
	MoE  Spec
	Attn AttnSpec // MLA's (DeepSeek), unless GQA is set
	// GQA is the grouped-query attention of the other families.
	GQA                *GQASpec
	Hidden, Layers     int
	FirstKDense, Vocab int
	DenseInter         int // intermediate_size: the dense layers' MLP width
	Seed               uint64
}

// Whole is a generated whole model: its config.json, tensors, and the
// weights widened exactly to float64.
type Whole struct {
	Spec    WholeSpec
	Config  map[string]any
	Tensors []stwrite.Tensor

	Embed, LMHead    [][]float64  // [vocab][hidden]
	Norm             []float64    // model.norm
	InNorm, PostNorm [][]float64  // per layer: input_layernorm, post_attention_layernorm
	Attn             []*AttnModel // per layer: MLA, or
	GQA              []*GQAModel  // grouped-query attention
	Dense            []*Expert64  // per layer: the dense MLP, nil on MoE layers
	MoE              []*Model     // per layer: the MoE block, nil on dense layers
}

// GenerateWhole makes a random whole model.
func GenerateWhole(s WholeSpec) (*Whole, error) {
	if s.Hidden < 1 || s.Layers < 1 || s.Vocab < 1 || s.DenseInter < 1 || s.FirstKDense < 0 || s.FirstKDense > s.Layers {
		return nil, fmt.Errorf("moetest: whole model spec %+v", s)
	}
	dt := s.MoE.DType
	if dt != "F32" && dt != "BF16" {
		return nil, fmt.Errorf("moetest: whole model dtype %q (F32 or BF16)", dt)
	}
	w := &Whole{Spec: s}
	rng := rand.New(rand.NewPCG(s.Seed, 0x3a0d))
	H := s.Hidden
	add := func(name string, rows, cols int, scale, offset float64) [][]float64 {
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = float32(offset + (rng.Float64()*2-1)*scale)
		}
		b, err := stwrite.Encode(dt, v)
		if err != nil {
			panic(err) // F32 and BF16 always encode
		}
		shape := []int{rows, cols}
		if rows == 1 {
			shape = []int{cols}
		}
		w.Tensors = append(w.Tensors, stwrite.Tensor{Name: name, DType: dt, Shape: shape, Data: b})
		f, _ := stwrite.Decode(dt, b)
		out := make([][]float64, rows)
		for r := range out {
			out[r] = f[r*cols : (r+1)*cols]
		}
		return out
	}
	w.Embed = add("model.embed_tokens.weight", s.Vocab, H, 1, 0)
	var config map[string]any
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		w.InNorm = append(w.InNorm, add(p+"input_layernorm.weight", 1, H, 0.2, 1)[0])
		w.PostNorm = append(w.PostNorm, add(p+"post_attention_layernorm.weight", 1, H, 0.2, 1)[0])
		var attnConfig map[string]any
		if s.GQA != nil {
			g, err := GenerateGQA(*s.GQA, H, l, dt, s.Seed+uint64(l)*7+1)
			if err != nil {
				return nil, err
			}
			w.Tensors = append(w.Tensors, g.Tensors...)
			w.GQA, w.Attn = append(w.GQA, g), append(w.Attn, nil)
			attnConfig = s.GQA.config(s.Layers)
		} else {
			as := s.Attn
			as.Hidden, as.Layer, as.DType, as.Seed = H, l, dt, s.Seed+uint64(l)*7+1
			am, err := GenerateAttention(as)
			if err != nil {
				return nil, err
			}
			w.Tensors = append(w.Tensors, am.Tensors...)
			w.Attn, w.GQA = append(w.Attn, am), append(w.GQA, nil)
			attnConfig = am.Config
		}
		if l < s.FirstKDense {
			I := s.DenseInter
			mlp := p + "mlp."
			x := &Expert64{
				Gate: add(mlp+"gate_proj.weight", I, H, 1/math.Sqrt(float64(H)), 0),
				Up:   add(mlp+"up_proj.weight", I, H, 1/math.Sqrt(float64(H)), 0),
				Down: add(mlp+"down_proj.weight", H, I, 1/math.Sqrt(float64(I)), 0),
			}
			w.Dense, w.MoE = append(w.Dense, x), append(w.MoE, nil)
			continue
		}
		ms := s.MoE
		ms.Hidden, ms.Layer, ms.NumLayers, ms.FirstKDense, ms.Seed = H, l, s.Layers, s.FirstKDense, s.Seed+uint64(l)*7+2
		if qwenLike(ms.ModelType) {
			ms.MLPOnly = nil
			for i := 0; i < s.FirstKDense; i++ {
				ms.MLPOnly = append(ms.MLPOnly, i)
			}
		}
		m, err := Generate(ms)
		if err != nil {
			return nil, err
		}
		w.Tensors = append(w.Tensors, m.Tensors...)
		w.Dense, w.MoE = append(w.Dense, nil), append(w.MoE, m)
		config = m.Config
		for k, v := range attnConfig {
			config[k] = v
		}
	}
	if config == nil {
		return nil, fmt.Errorf("moetest: a whole model needs a MoE layer (FirstKDense %d of %d layers)", s.FirstKDense, s.Layers)
	}
	w.Norm = add("model.norm.weight", 1, H, 0.2, 1)[0]
	w.LMHead = add("lm_head.weight", s.Vocab, H, 1/math.Sqrt(float64(H)), 0)
	config["vocab_size"] = s.Vocab
	switch {
	case qwenLike(s.MoE.ModelType): // intermediate_size is the dense layers', mlp_only_layers lists them
		config["intermediate_size"] = s.DenseInter
	case DeepSeekBlock(s.MoE.ModelType): // first_k_dense_replace dense layers of intermediate_size
		config["intermediate_size"] = s.DenseInter
		config["first_k_dense_replace"] = s.FirstKDense
	case s.GQA != nil: // every layer MoE: intermediate_size is the experts'
		if s.FirstKDense > 0 {
			return nil, fmt.Errorf("moetest: %s has no dense layers", s.MoE.ModelType)
		}
	default:
		config["intermediate_size"] = s.DenseInter
		config["first_k_dense_replace"] = s.FirstKDense
	}
	config["rms_norm_eps"] = 1e-6
	config["num_hidden_layers"] = s.Layers
	config["tie_word_embeddings"] = false
	w.Config = config
	return w, nil
}

// qwenLike reports whether family t lists its dense layers in
// mlp_only_layers.
func qwenLike(t string) bool { return t == "qwen2_moe" || t == "qwen3_moe" }

// config is the attention's config.json keys, as the families write them.
func (s GQASpec) config(layers int) map[string]any {
	c := map[string]any{"num_attention_heads": s.Heads, "num_key_value_heads": s.KVHeads, "head_dim": s.HeadDim, "rope_theta": s.Theta}
	if s.Window > 0 {
		c["sliding_window"] = s.Window
	} else {
		c["sliding_window"] = nil // as Mixtral ships it
	}
	if s.Sinks { // gpt-oss
		c["attention_bias"] = s.Bias
		types := make([]string, layers)
		for i := range types {
			types[i] = "full_attention"
			if !s.WindowEven || i%2 == 0 {
				types[i] = "sliding_attention"
			}
		}
		c["layer_types"] = types
	}
	if s.Partial != 0 {
		c["partial_rotary_factor"] = s.Partial
	}
	if s.Bias && !s.Sinks { // GLM-4.5's attention_bias (Qwen2-MoE's biases need no key)
		c["attention_bias"] = true
	}
	if s.QKNorm == "head" {
		c["use_qk_norm"] = true // GLM-4.5's switch (Qwen3-MoE's are always on)
	}
	if s.Yarn {
		c["rope_scaling"] = map[string]any{"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
			"original_max_position_embeddings": 4096, "truncate": s.YarnTruncate}
	}
	return c
}

// WriteTo writes the model as a Hugging Face checkpoint folder (one file).
func (w *Whole) WriteTo(dir string) error {
	return stwrite.WriteCheckpoint(dir, w.Config, w.Tensors, 1)
}

// rmsNorm64 is DeepSeek's RMSNorm: x / sqrt(mean(x²) + eps) · w.
func rmsNorm64(x, w []float64, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	r := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * r * w[i]
	}
	return out
}

// Logits is the float64 reference of a prefill of ids (one sequence, at
// positions 0…T-1): [T][vocab], written from DeepSeek-V2's
// DeepseekV2ForCausalLM: embedding; per layer h = x + attn(input_norm(x)),
// x = h + mlp(post_attention_norm(h)) with the dense MLP or the MoE block;
// the final norm; lm_head. Each block's input is rounded to float32, as the
// engine's activations are; everything else is float64.
func (w *Whole) Logits(ids []int32) [][]float64 {
	s := w.Spec
	H, T := s.Hidden, len(ids)
	eps := 1e-6
	x := make([][]float64, T)
	for t, id := range ids {
		x[t] = append([]float64(nil), w.Embed[id]...)
	}
	in32 := func(rows [][]float64) []float32 {
		out := make([]float32, 0, len(rows)*H)
		for _, r := range rows {
			for _, v := range r {
				out = append(out, float32(v))
			}
		}
		return out
	}
	for l := 0; l < s.Layers; l++ {
		normed := make([][]float64, T)
		for t := range x {
			normed[t] = rmsNorm64(x[t], w.InNorm[l], eps)
		}
		var a []float64
		if w.GQA[l] != nil {
			a = w.GQA[l].Forward(in32(normed), eps)
		} else {
			a = w.Attn[l].Forward(in32(normed))
		}
		for t := range x {
			for i := range x[t] {
				x[t][i] += a[t*H+i]
			}
			normed[t] = rmsNorm64(x[t], w.PostNorm[l], eps)
		}
		if d := w.Dense[l]; d != nil {
			for t := range x {
				y := expertForward(*d, widen(in32(normed[t:t+1])))
				for i := range x[t] {
					x[t][i] += y[i]
				}
			}
			continue
		}
		y := w.MoE[l].Forward(in32(normed)).Y
		for t := range x {
			for i := range x[t] {
				x[t][i] += y[t*H+i]
			}
		}
	}
	logits := make([][]float64, T)
	for t := range x {
		h := rmsNorm64(x[t], w.Norm, eps)
		logits[t] = make([]float64, s.Vocab)
		for v, row := range w.LMHead {
			logits[t][v] = dot(row, h)
		}
	}
	return logits
}
