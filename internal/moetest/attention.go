package moetest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/moex-project/moex/internal/stwrite"
)

// AttnSpec describes random DeepSeek-V2/V3 attention weights (self_attn.*).
type AttnSpec struct {
	Hidden, Heads          int
	QLoraRank              int // 0: a plain q_proj
	KVLoraRank, Nope, Rope int
	VDim                   int
	Theta                  float64
	Yarn                   bool // DeepSeek-V2-Lite's yarn scaling (factor 40, mscale 0.707)
	Layer                  int
	// DType of every tensor; F8_E4M3: the projections as fine-grained FP8
	// (F32 scales in blocks of FP8Block, zero: 128×128), the norms BF16, as
	// DeepSeek-V3 ships its attention.
	DType    string
	FP8Block [2]int
	Seed     uint64
}

// AttnModel is generated attention: config fields, tensors and their
// float64 values.
type AttnModel struct {
	Spec                           AttnSpec
	Config                         map[string]any
	Tensors                        []stwrite.Tensor
	QProj, QA, QB, KVA, KVB, OProj [][]float64
	QANorm, KVANorm                []float64
}

// GenerateAttention makes random attention weights.
func GenerateAttention(s AttnSpec) (*AttnModel, error) {
	m := &AttnModel{Spec: s}
	rng := rand.New(rand.NewPCG(s.Seed, 0xa77))
	p := fmt.Sprintf("model.layers.%d.self_attn.", s.Layer)
	var err error
	if s.DType == "F8_E4M3" && s.FP8Block == [2]int{} {
		s.FP8Block = [2]int{128, 128}
		m.Spec.FP8Block = s.FP8Block
	}
	add := func(name string, rows, cols int, scale, offset float64) [][]float64 {
		if s.DType == "F8_E4M3" && rows > 1 { // a projection (the norms are vectors)
			v := make([]float64, rows*cols)
			for i := range v {
				v[i] = offset + (rng.Float64()*2-1)*scale
			}
			data, scales, vals, e := quantizeFP8(v, rows, cols, s.FP8Block, "F32")
			if e != nil {
				err = e
				return nil
			}
			br, bc := s.FP8Block[0], s.FP8Block[1]
			m.Tensors = append(m.Tensors,
				stwrite.Tensor{Name: p + name, DType: "F8_E4M3", Shape: []int{rows, cols}, Data: data},
				stwrite.Tensor{Name: p + name + "_scale_inv", DType: "F32", Shape: []int{(rows + br - 1) / br, (cols + bc - 1) / bc}, Data: scales})
			return vals
		}
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = float32(offset + (rng.Float64()*2-1)*scale)
		}
		dtype := s.DType
		if dtype == "F8_E4M3" {
			dtype = "BF16"
		}
		b, e := stwrite.Encode(dtype, v)
		if e != nil {
			err = e
			return nil
		}
		shape := []int{rows, cols}
		if rows == 1 {
			shape = []int{cols}
		}
		m.Tensors = append(m.Tensors, stwrite.Tensor{Name: p + name, DType: dtype, Shape: shape, Data: b})
		w, _ := stwrite.Decode(dtype, b)
		out := make([][]float64, rows)
		for r := range out {
			out[r] = w[r*cols : (r+1)*cols]
		}
		return out
	}
	qd := s.Nope + s.Rope
	if s.QLoraRank == 0 {
		m.QProj = add("q_proj.weight", s.Heads*qd, s.Hidden, 1/math.Sqrt(float64(s.Hidden)), 0)
	} else {
		m.QA = add("q_a_proj.weight", s.QLoraRank, s.Hidden, 1/math.Sqrt(float64(s.Hidden)), 0)
		m.QANorm = add("q_a_layernorm.weight", 1, s.QLoraRank, 0.2, 1)[0]
		m.QB = add("q_b_proj.weight", s.Heads*qd, s.QLoraRank, 1/math.Sqrt(float64(s.QLoraRank)), 0)
	}
	m.KVA = add("kv_a_proj_with_mqa.weight", s.KVLoraRank+s.Rope, s.Hidden, 1/math.Sqrt(float64(s.Hidden)), 0)
	m.KVANorm = add("kv_a_layernorm.weight", 1, s.KVLoraRank, 0.2, 1)[0]
	m.KVB = add("kv_b_proj.weight", s.Heads*(s.Nope+s.VDim), s.KVLoraRank, 1/math.Sqrt(float64(s.KVLoraRank)), 0)
	m.OProj = add("o_proj.weight", s.Hidden, s.Heads*s.VDim, 1/math.Sqrt(float64(s.Heads*s.VDim)), 0)
	if err != nil {
		return nil, err
	}
	m.Config = map[string]any{
		"num_attention_heads": s.Heads, "kv_lora_rank": s.KVLoraRank, "qk_nope_head_dim": s.Nope,
		"qk_rope_head_dim": s.Rope, "v_head_dim": s.VDim, "rope_theta": s.Theta, "rms_norm_eps": 1e-6,
		"attention_bias": false, "q_lora_rank": nil,
	}
	if s.QLoraRank > 0 {
		m.Config["q_lora_rank"] = s.QLoraRank
	}
	if s.Yarn {
		m.Config["rope_scaling"] = map[string]any{"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
			"beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
	}
	return m, nil
}

// Forward is the float64 reference of the attention block over one
// sequence of tokens x [T, hidden] at positions 0..T-1, causal, written
// from DeepSeek-V2's DeepseekV2Attention (not in MLA's absorbed form): per
// head, keys [k_nope; RoPE(k_pe)] and values from kv_b_proj of the normed
// latent, queries [q_nope; RoPE(q_pe)], softmax(q·kᵀ·scale)·v, o_proj.
func (m *AttnModel) Forward(x []float32) []float64 {
	s := m.Spec
	H, nh, qd, L := s.Hidden, s.Heads, s.Nope+s.Rope, s.KVLoraRank
	T := len(x) / H
	matvec := func(w [][]float64, v []float64) []float64 {
		out := make([]float64, len(w))
		for i, row := range w {
			for j, a := range row {
				out[i] += a * v[j]
			}
		}
		return out
	}
	norm := func(v, w []float64) []float64 {
		var ms float64
		for _, a := range v {
			ms += a * a
		}
		ms /= float64(len(v))
		out := make([]float64, len(v))
		for i, a := range v {
			out[i] = w[i] * a / math.Sqrt(ms+1e-6)
		}
		return out
	}
	// Rotary tables, as DeepseekV2(Yarn)RotaryEmbedding builds them.
	d := s.Rope
	invFreq := make([]float64, d/2)
	for i := range invFreq {
		invFreq[i] = 1 / math.Pow(s.Theta, float64(2*i)/float64(d))
	}
	mscale, softmaxScale := 1.0, 1/math.Sqrt(float64(qd))
	if s.Yarn {
		const factor, orig, betaFast, betaSlow, ms, msAll = 40.0, 4096.0, 32.0, 1.0, 0.707, 0.707
		corrDim := func(rot float64) float64 {
			return float64(d) * math.Log(orig/(rot*2*math.Pi)) / (2 * math.Log(s.Theta))
		}
		low := math.Max(math.Floor(corrDim(betaFast)), 0)
		high := math.Min(math.Ceil(corrDim(betaSlow)), float64(d-1))
		if low == high {
			high += 0.001
		}
		getMscale := func(m float64) float64 { return 0.1*m*math.Log(factor) + 1 }
		for i := range invFreq {
			ramp := math.Min(math.Max((float64(i)-low)/(high-low), 0), 1)
			keep := 1 - ramp
			invFreq[i] = invFreq[i]/factor*(1-keep) + invFreq[i]*keep
		}
		mscale = getMscale(ms) / getMscale(msAll)
		softmaxScale *= getMscale(msAll) * getMscale(msAll)
	}
	// apply_rotary_pos_emb: de-interleave, then x·cos + rotate_half(x)·sin.
	rope := func(v []float64, pos int) []float64 {
		de := make([]float64, d)
		for i := 0; i < d/2; i++ {
			de[i], de[i+d/2] = v[2*i], v[2*i+1]
		}
		out := make([]float64, d)
		for i := 0; i < d; i++ {
			f := invFreq[i%(d/2)] * float64(pos)
			cs, sn := math.Cos(f)*mscale, math.Sin(f)*mscale
			rh := -de[(i+d/2)%d]
			if i >= d/2 {
				rh = de[i-d/2]
			}
			out[i] = de[i]*cs + rh*sn
		}
		return out
	}
	keys := make([][][]float64, T) // [t][head] key
	vals := make([][][]float64, T)
	queries := make([][][]float64, T)
	for t := 0; t < T; t++ {
		xt := make([]float64, H)
		for i := range xt {
			xt[i] = float64(x[t*H+i])
		}
		var q []float64
		if s.QLoraRank == 0 {
			q = matvec(m.QProj, xt)
		} else {
			q = matvec(m.QB, norm(matvec(m.QA, xt), m.QANorm))
		}
		kv := matvec(m.KVA, xt)
		c := norm(kv[:L], m.KVANorm)
		kpe := rope(kv[L:], t)
		kvb := matvec(m.KVB, c)
		keys[t], vals[t], queries[t] = make([][]float64, nh), make([][]float64, nh), make([][]float64, nh)
		for h := 0; h < nh; h++ {
			kh := kvb[h*(s.Nope+s.VDim) : (h+1)*(s.Nope+s.VDim)]
			keys[t][h] = append(append([]float64{}, kh[:s.Nope]...), kpe...)
			vals[t][h] = kh[s.Nope:]
			qh := q[h*qd : (h+1)*qd]
			queries[t][h] = append(append([]float64{}, qh[:s.Nope]...), rope(qh[s.Nope:], t)...)
		}
	}
	out := make([]float64, T*H)
	for t := 0; t < T; t++ {
		cat := make([]float64, nh*s.VDim)
		for h := 0; h < nh; h++ {
			sc := make([]float64, t+1)
			mx := math.Inf(-1)
			for j := 0; j <= t; j++ {
				var dot float64
				for i, a := range queries[t][h] {
					dot += a * keys[j][h][i]
				}
				sc[j] = dot * softmaxScale
				mx = math.Max(mx, sc[j])
			}
			var z float64
			for j := range sc {
				sc[j] = math.Exp(sc[j] - mx)
				z += sc[j]
			}
			for j := range sc {
				for i, v := range vals[j][h] {
					cat[h*s.VDim+i] += sc[j] / z * v
				}
			}
		}
		copy(out[t*H:(t+1)*H], matvec(m.OProj, cat))
	}
	return out
}

// LayerFixture is the small DeepSeek-V2 MoE layer (8 experts, top-3, a
// shared expert, bf16) the DP-attention tests run.
var LayerFixture = Spec{ModelType: "deepseek_v2", Hidden: 32, Experts: 8, TopK: 3, Inter: 16, SharedExperts: 1,
	Method: "greedy", Scoring: "softmax", NGroup: 1, TopKGroup: 1, DType: "BF16", Seed: 77}

// WriteAttnCheckpoint writes into dir a deepseek_v2 checkpoint with a small
// MoE layer (4 experts, top-2) and a's attention tensors for layer 0, and
// returns the attention's reference model.
func WriteAttnCheckpoint(dir string, a AttnSpec) (*AttnModel, error) {
	ms := Spec{ModelType: "deepseek_v2", Hidden: a.Hidden, Experts: 4, TopK: 2, Inter: 8, Method: "greedy",
		Scoring: "softmax", NGroup: 1, TopKGroup: 1, DType: a.DType, FP8Block: a.FP8Block, Seed: a.Seed}
	m, err := Generate(ms)
	if err != nil {
		return nil, err
	}
	am, err := GenerateAttention(a)
	if err != nil {
		return nil, err
	}
	for k, v := range am.Config {
		m.Config[k] = v
	}
	return am, stwrite.WriteCheckpoint(dir, m.Config, append(m.Tensors, am.Tensors...), 2)
}
