package moetest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/moex-project/moex/internal/stwrite"
)

// E2M1 is an OCP FP4 (e2m1) nibble's value from the format's definition:
// bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0 the mantissa,
// exponent 0 subnormal (0 or 0.5).
func E2M1(n uint8) float64 {
	sign := 1.0
	if n&8 != 0 {
		sign = -1
	}
	exp, man := int(n>>1&3), float64(n&1)
	if exp == 0 {
		return sign * man / 2
	}
	return sign * (1 + man/2) * math.Pow(2, float64(exp-1))
}

// generateGptOss makes a gpt_oss layer as its checkpoints store it: the
// router with its bias; the experts fused, gate and up interleaved, with
// biases; in MXFP4 (DType "MXFP4": _blocks [E, out, in/32, 16] and E8M0
// _scales [E, out, in/32], the rest BF16) or dense in Hugging Face's
// x·W form (gate_up_proj [E, H, 2I], down_proj [E, I, H]).
func generateGptOss(s Spec) (*Model, error) {
	m := &Model{Spec: s}
	rng := rand.New(rand.NewPCG(s.Seed, 0x6d6f6578))
	H, I, E := s.Hidden, s.Inter, s.Experts
	p := fmt.Sprintf("model.layers.%d.mlp.", s.Layer)
	dense := s.DType
	if s.DType == "MXFP4" {
		dense = "BF16"
		if H%32 != 0 || I%32 != 0 {
			return nil, fmt.Errorf("moetest: MXFP4 needs hidden %d and inter %d to be multiples of 32", H, I)
		}
	}
	var err error
	// tensor writes v (of the given shape) in dtype and returns its stored
	// values widened to float64.
	tensor := func(name, dtype string, shape []int, v []float64) []float64 {
		f := make([]float32, len(v))
		for i, x := range v {
			f[i] = float32(x)
		}
		b, e := stwrite.Encode(dtype, f)
		if e != nil {
			err = e
			return nil
		}
		m.Tensors = append(m.Tensors, stwrite.Tensor{Name: name, DType: dtype, Shape: shape, Data: b})
		w, _ := stwrite.Decode(dtype, b)
		return w
	}
	uniform := func(n int, scale float64) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = (rng.Float64()*2 - 1) * scale
		}
		return v
	}
	rows := func(v []float64, cols int) [][]float64 {
		out := make([][]float64, len(v)/cols)
		for r := range out {
			out[r] = v[r*cols : (r+1)*cols]
		}
		return out
	}
	m.Gate = rows(tensor(p+"router.weight", dense, []int{E, H}, uniform(E*H, 2/math.Sqrt(float64(H)))), H)
	m.RouterBias = tensor(p+"router.bias", dense, []int{E}, uniform(E, 0.5))
	m.Experts = make([]Expert64, E)
	for e := range m.Experts {
		m.Experts[e].Gate, m.Experts[e].Up = make([][]float64, I), make([][]float64, I)
		m.Experts[e].Down = make([][]float64, H)
	}
	// Biases large enough that the clamps bind on some columns.
	gub := rows(tensor(p+"experts.gate_up_proj_bias", dense, []int{E, 2 * I}, uniform(E*2*I, 9)), 2*I)
	db := rows(tensor(p+"experts.down_proj_bias", dense, []int{E, H}, uniform(E*H, 0.5)), H)
	for e := range m.Experts {
		x := &m.Experts[e]
		for n := 0; n < I; n++ {
			x.GateBias = append(x.GateBias, gub[e][2*n])
			x.UpBias = append(x.UpBias, gub[e][2*n+1])
		}
		x.DownBias = db[e]
	}
	if s.DType == "MXFP4" {
		// Random nibbles and scales: element [o, i] of expert e is
		// E2M1(nibble) × 2^(scale − 127), the even element in the low nibble.
		mx := func(name string, out, in int, scaleExp int, set func(e, o int, row []float64)) {
			blocks := make([]byte, E*out*in/2)
			scales := make([]byte, E*out*in/32)
			for i := range blocks {
				blocks[i] = byte(rng.IntN(256))
			}
			for i := range scales {
				scales[i] = byte(127 + scaleExp - rng.IntN(3))
			}
			for e := 0; e < E; e++ {
				for o := 0; o < out; o++ {
					row := make([]float64, in)
					for i := range row {
						k := (e*out+o)*in + i
						nib := blocks[k/2] >> (4 * (k % 2)) & 15
						row[i] = E2M1(nib) * math.Ldexp(1, int(scales[k/32])-127)
					}
					set(e, o, row)
				}
			}
			m.Tensors = append(m.Tensors,
				stwrite.Tensor{Name: name + "_blocks", DType: "U8", Shape: []int{E, out, in / 32, 16}, Data: blocks},
				stwrite.Tensor{Name: name + "_scales", DType: "U8", Shape: []int{E, out, in / 32}, Data: scales})
		}
		exp := func(cols int) int { return -int(math.Round(math.Log2(2.5 * math.Sqrt(float64(cols))))) }
		mx(p+"experts.gate_up_proj", 2*I, H, exp(H), func(e, o int, row []float64) {
			if o%2 == 0 {
				m.Experts[e].Gate[o/2] = row
			} else {
				m.Experts[e].Up[o/2] = row
			}
		})
		mx(p+"experts.down_proj", H, I, exp(I), func(e, o int, row []float64) { m.Experts[e].Down[o] = row })
	} else {
		// x·W form: gate_up[e][k][2n] is gate[n][k], [2n+1] up[n][k];
		// down[e][k][n] is down[n][k].
		gu := tensor(p+"experts.gate_up_proj", dense, []int{E, H, 2 * I}, uniform(E*H*2*I, 1/math.Sqrt(float64(H))))
		d := tensor(p+"experts.down_proj", dense, []int{E, I, H}, uniform(E*I*H, 1/math.Sqrt(float64(I))))
		for e := range m.Experts {
			x := &m.Experts[e]
			for n := 0; n < I; n++ {
				x.Gate[n], x.Up[n] = make([]float64, H), make([]float64, H)
				for k := 0; k < H; k++ {
					x.Gate[n][k] = gu[(e*H+k)*2*I+2*n]
					x.Up[n][k] = gu[(e*H+k)*2*I+2*n+1]
				}
			}
			for n := 0; n < H; n++ {
				x.Down[n] = make([]float64, I)
				for k := 0; k < I; k++ {
					x.Down[n][k] = d[(e*I+k)*H+n]
				}
			}
		}
	}
	if err != nil {
		return nil, err
	}
	c := map[string]any{
		"model_type":          "gpt_oss",
		"architectures":       []string{"GptOssForCausalLM"},
		"hidden_size":         H,
		"num_hidden_layers":   s.NumLayers,
		"num_local_experts":   E,
		"num_experts_per_tok": s.TopK,
		"experts_per_token":   s.TopK,
		"intermediate_size":   I,
		"swiglu_limit":        swigluLimit(s),
		"torch_dtype":         map[string]string{"F32": "float32", "BF16": "bfloat16", "F16": "float16", "MXFP4": "bfloat16"}[s.DType],
	}
	if s.DType == "MXFP4" {
		c["quantization_config"] = map[string]any{"quant_method": "mxfp4",
			"modules_to_not_convert": []string{"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}
	}
	for k, v := range s.Extra {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	m.Config = c
	return m, nil
}

func swigluLimit(s Spec) float64 {
	if s.SwigluLimit == 0 {
		return 7
	}
	return s.SwigluLimit
}

// forwardGptOss is the float64 reference of gpt-oss's MoE block, from
// Hugging Face's GptOssTopKRouter and GptOssExperts: logits = W·x + b;
// the top-k logits (ties to the lower index), softmax over those k;
// each expert g = gate·x + b_g, u = up·x + b_u, g = min(g, L),
// u = clamp(u, −L, L), h = g·σ(1.702·g)·(u + 1), out = down·h + b_d;
// y = Σ weight·out.
func (m *Model) forwardGptOss(x []float32) Result {
	s := m.Spec
	H, E, K := s.Hidden, s.Experts, s.TopK
	L := swigluLimit(s)
	T := len(x) / H
	res := Result{Y: make([]float64, T*H), IDs: make([]int32, T*K), Weights: make([]float64, T*K)}
	for t := 0; t < T; t++ {
		xt := widen(x[t*H : (t+1)*H])
		logits := make([]float64, E)
		for e := range logits {
			logits[e] = dot(m.Gate[e], xt) + m.RouterBias[e]
		}
		top := argmaxK(logits, K, nil)
		mx := logits[top[0]]
		var z float64
		for _, e := range top {
			z += math.Exp(logits[e] - mx)
		}
		weight := map[int]float64{}
		for _, e := range top {
			weight[e] = math.Exp(logits[e]-mx) / z
		}
		picked := append([]int(nil), top...)
		sortInts(picked)
		yt := res.Y[t*H : (t+1)*H]
		for j, e := range picked {
			res.IDs[t*K+j] = int32(e)
			res.Weights[t*K+j] = weight[e]
			ex := m.Experts[e]
			h := make([]float64, len(ex.Gate))
			for n := range h {
				g := math.Min(dot(ex.Gate[n], xt)+ex.GateBias[n], L)
				u := math.Max(-L, math.Min(dot(ex.Up[n], xt)+ex.UpBias[n], L))
				h[n] = g * sigmoid(1.702*g) * (u + 1)
			}
			for n := range yt {
				yt[n] += weight[e] * (dot(ex.Down[n], h) + ex.DownBias[n])
			}
		}
	}
	return res
}

func sortInts(v []int) {
	for i := 1; i < len(v); i++ {
		for j := i; j > 0 && v[j] < v[j-1]; j-- {
			v[j], v[j-1] = v[j-1], v[j]
		}
	}
}
