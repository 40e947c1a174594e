package moetest

import (
	"math"
	"sort"
)

// Result is the reference output for an input [tokens, hidden].
type Result struct {
	Y       []float64 // [tokens, hidden]
	IDs     []int32   // [tokens, top_k], each row ascending
	Weights []float64 // [tokens, top_k], in the order of IDs
}

// Forward is the float64 reference of the MoE block, written from the
// families' Hugging Face / DeepSeek definitions:
//
//	mixtral:     softmax, top-k, always renormalised
//	qwen2_moe:   softmax, top-k, renormalised iff norm_topk_prob; plus
//	             sigmoid(shared_expert_gate·x) · shared_expert(x)
//	qwen3_moe:   softmax, top-k, renormalised iff norm_topk_prob
//	qwen3_next:  as qwen2_moe
//	qwen3_5_moe: as qwen2_moe, always renormalised
//	deepseek_v2: softmax; greedy or group-limited greedy (group score = max);
//	             renormalised (+1e-20) iff norm_topk_prob; × routed_scaling_factor;
//	             plus the shared experts
//	deepseek_v3: sigmoid; noaux_tc (choose on score + bias, groups by the sum
//	             of their top-2 biased scores, weight with the unbiased score);
//	             renormalised (+1e-20) iff norm_topk_prob; × routed_scaling_factor
//
//	glm4_moe, dots1: as deepseek_v3 (no topk_method or scoring_func keys)
//	olmoe:       softmax, top-k, renormalised iff norm_topk_prob
//	qwen3_vl_moe: as qwen3_moe, always renormalised
//	minimax_m2:  sigmoid; choose on score + e_score_correction_bias, no
//	             groups; the unbiased scores renormalised; no scaling
//	ernie4_5_moe: softmax; choose on softmax + moe_statics' bias; the
//	             unbiased softmax divided by max(sum, 1e-12); plus the
//	             shared experts
//	llama4:      top-k on the raw logits, weight sigmoid(logit) applied to
//	             the expert's input: Σ expert(w·x); plus the shared expert
//	             of x
//	step3_text:  softmax, top-k, renormalised iff norm_expert_weight; plus
//	             the shared expert, unweighted
//	gpt_oss:     see forwardGptOss
//	deepseek_v4: see forwardDeepseekV4 (ForwardTokens for a hash layer)
//	gemma4:      see forwardGemma4
//
// Experts are down(silu(gate·x) ⊙ up·x). Ties in a ranking go to the lower
// index.
func (m *Model) Forward(x []float32) Result {
	switch m.Spec.ModelType {
	case "gpt_oss":
		return m.forwardGptOss(x)
	case "deepseek_v4", "gemma4":
		return m.ForwardTokens(x, nil)
	}
	s := m.Spec
	H, E, K := s.Hidden, s.Experts, s.TopK
	T := len(x) / H
	res := Result{Y: make([]float64, T*H), IDs: make([]int32, T*K), Weights: make([]float64, T*K)}
	scoring, method := "softmax", "greedy"
	switch s.ModelType {
	case "deepseek_v2", "deepseek_v3":
		scoring, method = s.Scoring, s.Method
	case "glm4_moe", "dots1":
		scoring, method = "sigmoid", "noaux_tc"
	case "minimax_m2":
		scoring, method = "sigmoid", "biased"
	case "ernie4_5_moe":
		method = "biased"
	case "llama4":
		scoring, method = "sigmoid", "logits"
	}
	for t := 0; t < T; t++ {
		xt := widen(x[t*H : (t+1)*H])
		logits := make([]float64, E)
		for e := range logits {
			logits[e] = dot(m.Gate[e], xt)
		}
		scores := make([]float64, E)
		if scoring == "sigmoid" {
			for e, l := range logits {
				scores[e] = sigmoid(l)
			}
		} else {
			mx := math.Inf(-1)
			for _, l := range logits {
				mx = math.Max(mx, l)
			}
			var z float64
			for e, l := range logits {
				scores[e] = math.Exp(l - mx)
				z += scores[e]
			}
			for e := range scores {
				scores[e] /= z
			}
		}
		choose := append([]float64(nil), scores...)
		if method == "logits" {
			copy(choose, logits)
		}
		if method == "noaux_tc" || method == "biased" {
			for e := range choose {
				choose[e] += m.Bias[e]
			}
		}
		allowed := make([]bool, E)
		for e := range allowed {
			allowed[e] = true
		}
		if method == "group_limited_greedy" || method == "noaux_tc" {
			per := E / s.NGroup
			gscore := make([]float64, s.NGroup)
			for g := range gscore {
				grp := append([]float64(nil), choose[g*per:(g+1)*per]...)
				sort.Sort(sort.Reverse(sort.Float64Slice(grp)))
				if method == "group_limited_greedy" {
					gscore[g] = grp[0]
				} else {
					gscore[g] = grp[0]
					if per > 1 {
						gscore[g] += grp[1]
					}
				}
			}
			for e := range allowed {
				allowed[e] = false
			}
			for _, g := range argmaxK(gscore, s.TopKGroup, nil) {
				for e := g * per; e < (g+1)*per; e++ {
					allowed[e] = true
				}
			}
		}
		picked := argmaxK(choose, K, allowed)
		sort.Ints(picked)

		w := make([]float64, K)
		var sum float64
		for j, e := range picked {
			w[j] = scores[e]
			sum += w[j]
		}
		switch s.ModelType {
		case "mixtral", "minimax_m2":
			for j := range w {
				w[j] /= sum
			}
		case "ernie4_5_moe":
			for j := range w {
				w[j] /= math.Max(sum, 1e-12)
			}
		case "qwen3_vl_moe": // always (Qwen3VLMoeTextTopKRouter ignores norm_topk_prob)
			for j := range w {
				w[j] /= sum
			}
		case "olmoe":
			if s.NormTopK {
				for j := range w {
					w[j] /= sum
				}
			}
		case "qwen3_5_moe": // always
			for j := range w {
				w[j] /= sum
			}
		case "qwen2_moe", "qwen3_moe", "qwen3_next", "step3_text":
			if s.NormTopK {
				for j := range w {
					w[j] /= sum
				}
			}
		case "deepseek_v2", "deepseek_v3", "glm4_moe", "dots1":
			if s.NormTopK {
				for j := range w {
					w[j] /= sum + 1e-20
				}
			}
			for j := range w {
				w[j] *= scaling(s)
			}
		}
		yt := res.Y[t*H : (t+1)*H]
		for j, e := range picked {
			res.IDs[t*K+j] = int32(e)
			res.Weights[t*K+j] = w[j]
			if s.ModelType == "llama4" {
				in := make([]float64, H)
				for i, v := range xt {
					in[i] = w[j] * v
				}
				for i, v := range expertForward(m.Experts[e], in) {
					yt[i] += v
				}
				continue
			}
			o := expertForward(m.Experts[e], xt)
			for i := range yt {
				yt[i] += w[j] * o[i]
			}
		}
		if m.Shared != nil {
			o := expertForward(*m.Shared, xt)
			g := 1.0
			if m.SharedGate != nil {
				g = sigmoid(dot(m.SharedGate, xt))
			}
			for i := range yt {
				yt[i] += g * o[i]
			}
		}
	}
	return res
}

func expertForward(x Expert64, in []float64) []float64 {
	h := make([]float64, len(x.Gate))
	for n := range h {
		g := dot(x.Gate[n], in)
		h[n] = g * sigmoid(g) * dot(x.Up[n], in)
	}
	out := make([]float64, len(x.Down))
	for n := range out {
		out[n] = dot(x.Down[n], h)
	}
	return out
}

// widen is x in float64.
func widen(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

func sigmoid(v float64) float64 { return 1 / (1 + math.Exp(-v)) }

// argmaxK returns the indices of the k largest values among the allowed
// ones (all when allowed is nil), best first; ties go to the lower index.
func argmaxK(v []float64, k int, allowed []bool) []int {
	taken := make([]bool, len(v))
	out := make([]int, 0, k)
	for len(out) < k {
		best := -1
		for i, x := range v {
			if taken[i] || (allowed != nil && !allowed[i]) {
				continue
			}
			if best < 0 || x > v[best] {
				best = i
			}
		}
		if best < 0 {
			break
		}
		taken[best] = true
		out = append(out, best)
	}
	return out
}

// RelErr is ‖got − want‖ / ‖want‖ (‖got‖ when want is zero).
func RelErr(got []float32, want []float64) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		num += d * d
		den += w * w
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}
