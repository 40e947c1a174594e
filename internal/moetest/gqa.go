package moetest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/moex-project/moex/internal/stwrite"
)

// GQASpec is a grouped-query attention block to generate, with the
// settings the families' modeling files give it.
type GQASpec struct {
	Heads, KVHeads, HeadDim int
	// QKNorm: "" none, "head" (Qwen3MoeAttention's q_norm and k_norm of
	// head_dim), "whole" (OlmoeAttention's, over all the heads at once).
	QKNorm string
	// Bias: q, k, v biases (Qwen2-MoE, gpt-oss); OutBias: o_proj's too
	// (gpt-oss). Sinks: gpt-oss's learned sink per head.
	Bias, OutBias, Sinks bool
	// Window is the sliding window; WindowEven puts it on the even layers
	// only (gpt-oss's layer_types), else on every layer (Mixtral).
	Window     int
	WindowEven bool
	Theta      float64
	// Yarn: gpt-oss's rope_scaling (yarn, factor 32, beta 32 and 1,
	// original_max_position_embeddings 4096, truncate false).
	Yarn bool
	// YarnTruncate rounds yarn's ramp bounds (transformers' default, and
	// what ggml always does); gpt-oss's release turns it off.
	YarnTruncate bool
	// Partial is partial_rotary_factor (0: 1): RoPE turns the first
	// head_dim·Partial values of each head (GLM-4.5: 0.5).
	Partial float64
}

// GQAModel is generated grouped-query attention: tensors and their
// float64 values.
type GQAModel struct {
	Spec           GQASpec
	Hidden, Layer  int
	Tensors        []stwrite.Tensor
	Q, K, V, O     [][]float64
	QB, KB, VB, OB []float64
	QNorm, KNorm   []float64
	Sinks          []float64
}

// GenerateGQA makes layer's attention weights in dtype: projections
// uniform in ±1/√fan_in, biases in ±0.1, norms 1 ± 0.2, sinks in ±1.
func GenerateGQA(s GQASpec, hidden, layer int, dtype string, seed uint64) (*GQAModel, error) {
	if s.Heads < 1 || s.KVHeads < 1 || s.Heads%s.KVHeads != 0 || s.HeadDim < 2 || s.HeadDim%2 != 0 {
		return nil, fmt.Errorf("moetest: gqa spec %+v", s)
	}
	m := &GQAModel{Spec: s, Hidden: hidden, Layer: layer}
	rng := rand.New(rand.NewPCG(seed, 0x9a))
	p := fmt.Sprintf("model.layers.%d.self_attn.", layer)
	add := func(name string, rows, cols int, scale, offset float64) [][]float64 {
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = float32(offset + (rng.Float64()*2-1)*scale)
		}
		b, err := stwrite.Encode(dtype, v)
		if err != nil {
			panic(err)
		}
		shape := []int{rows, cols}
		if rows == 1 {
			shape = []int{cols}
		}
		m.Tensors = append(m.Tensors, stwrite.Tensor{Name: p + name, DType: dtype, Shape: shape, Data: b})
		f, _ := stwrite.Decode(dtype, b)
		out := make([][]float64, rows)
		for r := range out {
			out[r] = f[r*cols : (r+1)*cols]
		}
		return out
	}
	H, nh, kv, d := hidden, s.Heads, s.KVHeads, s.HeadDim
	m.Q = add("q_proj.weight", nh*d, H, 1/math.Sqrt(float64(H)), 0)
	m.K = add("k_proj.weight", kv*d, H, 1/math.Sqrt(float64(H)), 0)
	m.V = add("v_proj.weight", kv*d, H, 1/math.Sqrt(float64(H)), 0)
	m.O = add("o_proj.weight", H, nh*d, 1/math.Sqrt(float64(nh*d)), 0)
	if s.Bias {
		m.QB = add("q_proj.bias", 1, nh*d, 0.1, 0)[0]
		m.KB = add("k_proj.bias", 1, kv*d, 0.1, 0)[0]
		m.VB = add("v_proj.bias", 1, kv*d, 0.1, 0)[0]
	}
	if s.OutBias {
		m.OB = add("o_proj.bias", 1, H, 0.1, 0)[0]
	}
	switch s.QKNorm {
	case "head":
		m.QNorm, m.KNorm = add("q_norm.weight", 1, d, 0.2, 1)[0], add("k_norm.weight", 1, d, 0.2, 1)[0]
	case "whole":
		m.QNorm, m.KNorm = add("q_norm.weight", 1, nh*d, 0.2, 1)[0], add("k_norm.weight", 1, kv*d, 0.2, 1)[0]
	}
	if s.Sinks {
		m.Sinks = add("sinks", 1, nh, 1, 0)[0]
	}
	return m, nil
}

// rotary is the rotated values of a head: int(head_dim ·
// partial_rotary_factor), as transformers' rotary embedding takes its dim.
func (m *GQAModel) rotary() int {
	if m.Spec.Partial == 0 {
		return m.Spec.HeadDim
	}
	return int(float64(m.Spec.HeadDim) * m.Spec.Partial)
}

// window is the layer's sliding window, 0 for none.
func (m *GQAModel) window() int {
	if m.Spec.WindowEven && m.Layer%2 != 0 {
		return 0
	}
	return m.Spec.Window
}

// invFreq is the rotary inverse frequencies, as transformers'
// _compute_default_rope_parameters and (with Yarn) _compute_yarn_parameters
// make them, and the attention factor on cos and sin.
func (m *GQAModel) invFreq() ([]float64, float64) {
	d, theta := m.rotary(), m.Spec.Theta
	base := make([]float64, d/2)
	for i := range base {
		base[i] = 1 / math.Pow(theta, float64(2*i)/float64(d))
	}
	if !m.Spec.Yarn {
		return base, 1
	}
	const factor, orig, betaFast, betaSlow = 32.0, 4096.0, 32.0, 1.0
	corrDim := func(rot float64) float64 {
		return float64(d) * math.Log(orig/(rot*2*math.Pi)) / (2 * math.Log(theta))
	}
	low, high := corrDim(betaFast), corrDim(betaSlow)
	if m.Spec.YarnTruncate {
		low, high = math.Floor(low), math.Ceil(high)
	}
	low, high = math.Max(low, 0), math.Min(high, float64(d-1))
	out := make([]float64, d/2)
	for i := range out {
		ramp := math.Min(math.Max((float64(i)-low)/(high-low), 0), 1)
		extrapolation := 1 - ramp
		out[i] = base[i]/factor*(1-extrapolation) + base[i]*extrapolation
	}
	return out, 0.1*math.Log(factor) + 1
}

// Forward is the float64 reference of the block over one sequence of
// tokens x [T, hidden] at positions 0…T-1, written from transformers'
// Qwen3MoeAttention, OlmoeAttention, MixtralAttention and GptOssAttention:
// q, k, v projections (+ biases), the QK norms (eps), RoPE by rotate_half,
// scores q·kᵀ/√head_dim under the causal (and sliding-window) mask, the
// sinks joining the softmax, the values weighted, o_proj (+ bias).
func (m *GQAModel) Forward(x []float32, eps float64) []float64 {
	s := m.Spec
	H, nh, kv, d := m.Hidden, s.Heads, s.KVHeads, s.HeadDim
	T := len(x) / H
	lin := func(w [][]float64, b, v []float64) []float64 {
		out := make([]float64, len(w))
		for i, row := range w {
			for j, a := range row {
				out[i] += a * v[j]
			}
			if b != nil {
				out[i] += b[i]
			}
		}
		return out
	}
	norm := func(v, w []float64) {
		for r := 0; r < len(v); r += len(w) {
			var ms float64
			for _, a := range v[r : r+len(w)] {
				ms += a * a
			}
			inv := 1 / math.Sqrt(ms/float64(len(w))+eps)
			for i := range w {
				v[r+i] = w[i] * v[r+i] * inv
			}
		}
	}
	freq, attnFactor := m.invFreq()
	rot := m.rotary()
	rope := func(v []float64, pos int) { // one head's rotated part: x·cos + rotate_half(x)·sin; the rest passes
		out := make([]float64, rot)
		for i := 0; i < rot; i++ {
			f := freq[i%(rot/2)] * float64(pos)
			rh := -v[(i+rot/2)%rot]
			if i >= rot/2 {
				rh = v[i-rot/2]
			}
			out[i] = v[i]*math.Cos(f)*attnFactor + rh*math.Sin(f)*attnFactor
		}
		copy(v, out)
	}
	qs, ks, vs := make([][]float64, T), make([][]float64, T), make([][]float64, T)
	for t := 0; t < T; t++ {
		xt := widen(x[t*H : (t+1)*H])
		qs[t], ks[t], vs[t] = lin(m.Q, m.QB, xt), lin(m.K, m.KB, xt), lin(m.V, m.VB, xt)
		if m.QNorm != nil {
			norm(qs[t], m.QNorm)
			norm(ks[t], m.KNorm)
		}
		for h := 0; h < nh; h++ {
			rope(qs[t][h*d:(h+1)*d], t)
		}
		for h := 0; h < kv; h++ {
			rope(ks[t][h*d:(h+1)*d], t)
		}
	}
	W := m.window()
	out := make([]float64, T*H)
	for t := 0; t < T; t++ {
		o := make([]float64, nh*d)
		for h := 0; h < nh; h++ {
			g := h / (nh / kv)
			var logits []float64
			var keys []int
			for j := 0; j <= t; j++ {
				if W > 0 && j <= t-W {
					continue // outside the window: kv_idx > q_idx − sliding_window
				}
				logits = append(logits, dot(qs[t][h*d:(h+1)*d], ks[j][g*d:(g+1)*d])/math.Sqrt(float64(d)))
				keys = append(keys, j)
			}
			top := math.Inf(-1)
			for _, l := range logits {
				top = math.Max(top, l)
			}
			if m.Sinks != nil {
				top = math.Max(top, m.Sinks[h])
			}
			var sum float64
			for _, l := range logits {
				sum += math.Exp(l - top)
			}
			if m.Sinks != nil {
				sum += math.Exp(m.Sinks[h] - top)
			}
			for i, j := range keys {
				p := math.Exp(logits[i]-top) / sum
				for c := 0; c < d; c++ {
					o[h*d+c] += p * vs[j][g*d+c]
				}
			}
		}
		copy(out[t*H:(t+1)*H], lin(m.O, m.OB, o))
	}
	return out
}
