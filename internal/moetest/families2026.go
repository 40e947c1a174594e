package moetest

import (
	"math"
	"sort"
)

// ForwardTokens is Forward for a batch with token ids [tokens] (nil for
// none), which deepseek_v4's hash layers route by.
func (m *Model) ForwardTokens(x []float32, tokens []int32) Result {
	switch m.Spec.ModelType {
	case "deepseek_v4":
		return m.forwardDeepseekV4(x, tokens)
	case "gemma4":
		return m.forwardGemma4(x)
	}
	return m.Forward(x)
}

// forwardDeepseekV4 is the float64 reference of DeepSeek-V4's MoE block,
// from Hugging Face's DeepseekV4TopKRouter, DeepseekV4HashRouter,
// DeepseekV4Experts and DeepseekV4MLP: s = sqrt(softplus(W·x)); a score
// layer takes the top-k of s + e_score_correction_bias (ties to the lower
// index), a hash layer the experts tid2eid[token]; weights s of those /
// (their sum + 1e-20) × routed_scaling_factor; each expert
// g = min(gate·x, L), u = clamp(up·x, −L, L), down·(silu(g)·u); plus the
// shared expert down·(silu(gate·x)·up·x), unclamped.
func (m *Model) forwardDeepseekV4(x []float32, tokens []int32) Result {
	s := m.Spec
	H, E, K := s.Hidden, s.Experts, s.TopK
	L := v4Limit(s)
	T := len(x) / H
	res := Result{Y: make([]float64, T*H), IDs: make([]int32, T*K), Weights: make([]float64, T*K)}
	clamped := func(g, u float64) float64 {
		g, u = math.Min(g, L), math.Max(-L, math.Min(u, L))
		return g * sigmoid(g) * u
	}
	for t := 0; t < T; t++ {
		xt := widen(x[t*H : (t+1)*H])
		score := make([]float64, E)
		for e := range score {
			score[e] = math.Sqrt(math.Log(1 + math.Exp(dot(m.Gate[e], xt))))
		}
		var picked []int
		if s.Hash() {
			picked = append(picked, m.TokenExperts[tokens[t]]...)
		} else {
			choose := make([]float64, E)
			for e := range choose {
				choose[e] = score[e] + m.Bias[e]
			}
			picked = argmaxK(choose, K, nil)
		}
		sort.Ints(picked)
		var sum float64
		for _, e := range picked {
			sum += score[e]
		}
		yt := res.Y[t*H : (t+1)*H]
		for j, e := range picked {
			w := score[e] / (sum + 1e-20) * scaling(s)
			res.IDs[t*K+j], res.Weights[t*K+j] = int32(e), w
			for i, v := range expertAct(m.Experts[e], xt, clamped) {
				yt[i] += w * v
			}
		}
		if m.Shared != nil {
			for i, v := range expertForward(*m.Shared, xt) {
				yt[i] += v
			}
		}
	}
	return res
}

// forwardGemma4 is the float64 reference of Gemma 4's feed-forward
// sublayer with its MoE block, from Hugging Face's Gemma4TextRouter and
// Gemma4TextDecoderLayer, for the residual x: the router reads
// rms(x) · router.scale · hidden^−½ (rms without weight), softmax, top-k
// (ties to the lower index), renormalised, × per_expert_scale; the experts
// (GeGLU, GELU's tanh form) read pre_feedforward_layernorm_2(x), the dense
// MLP (GeGLU) pre_feedforward_layernorm(x); the output is
// post_feedforward_layernorm(post_feedforward_layernorm_1(mlp) +
// post_feedforward_layernorm_2(Σ w·expert)), what the decoder adds to x.
// Every norm is x / sqrt(mean(x²) + 1e-6) · weight.
func (m *Model) forwardGemma4(x []float32) Result {
	s := m.Spec
	H, E, K := s.Hidden, s.Experts, s.TopK
	T := len(x) / H
	res := Result{Y: make([]float64, T*H), IDs: make([]int32, T*K), Weights: make([]float64, T*K)}
	rms := func(v, w []float64) []float64 {
		var ss float64
		for _, a := range v {
			ss += a * a
		}
		out := make([]float64, len(v))
		for i, a := range v {
			out[i] = a / math.Sqrt(ss/float64(len(v))+1e-6)
			if w != nil {
				out[i] *= w[i]
			}
		}
		return out
	}
	geglu := func(g, u float64) float64 {
		return 0.5 * g * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(g+0.044715*g*g*g))) * u
	}
	for t := 0; t < T; t++ {
		xt := widen(x[t*H : (t+1)*H])
		in := rms(xt, nil)
		for i := range in {
			in[i] *= m.RouterScale[i] / math.Sqrt(float64(H))
		}
		prob := make([]float64, E)
		var z float64
		for e := range prob {
			prob[e] = math.Exp(dot(m.Gate[e], in))
			z += prob[e]
		}
		for e := range prob {
			prob[e] /= z
		}
		picked := argmaxK(prob, K, nil)
		sort.Ints(picked)
		var sum float64
		for _, e := range picked {
			sum += prob[e]
		}
		moe := make([]float64, H)
		xe := rms(xt, m.Norms[2])
		for j, e := range picked {
			w := prob[e] / sum * m.ExpertScale[e]
			res.IDs[t*K+j], res.Weights[t*K+j] = int32(e), w
			for i, v := range expertAct(m.Experts[e], xe, geglu) {
				moe[i] += w * v
			}
		}
		moe = rms(moe, m.Norms[3])
		dense := rms(expertAct(*m.Shared, rms(xt, m.Norms[0]), geglu), m.Norms[1])
		for i := range moe {
			moe[i] += dense[i]
		}
		copy(res.Y[t*H:(t+1)*H], rms(moe, m.Norms[4]))
	}
	return res
}

// expertAct is down(act(gate·in, up·in)).
func expertAct(x Expert64, in []float64, act func(g, u float64) float64) []float64 {
	h := make([]float64, len(x.Gate))
	for n := range h {
		h[n] = act(dot(x.Gate[n], in), dot(x.Up[n], in))
	}
	out := make([]float64, len(x.Down))
	for n := range out {
		out[n] = dot(x.Down[n], h)
	}
	return out
}
