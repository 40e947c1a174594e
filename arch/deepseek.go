package arch

import (
	"fmt"

	"github.com/moex-project/moex/internal/errkind"
)

// DeepSeek-V2 and V3 (transformers' modeling_deepseek_v2.py and
// modeling_deepseek_v3.py; the released checkpoints' config.json): MLA
// attention, leading dense layers (first_k_dense_replace, every
// moe_layer_freq-th after them MoE), and the DeepSeek MoE block. V2 routes
// greedily (or group_limited_greedy) over a softmax, V3 with noaux_tc over
// sigmoid scores; both add n_shared_experts fused as one MLP.
var deepseekV2 = &family{
	name:      "deepseek_v2",
	classes:   []string{"DeepseekV2ForCausalLM"},
	read:      readDeepSeek,
	dense:     deepseekDense,
	names:     mlpNames,
	whole:     true,
	ggufWhole: true,
	gguf:      []string{"deepseek2"},
	fromGGUF: func(m *ggufMeta, cfg map[string]any) error {
		deepseekGGUF(m, cfg, false)
		return nil
	},
}

var deepseekV3 = &family{
	name: "deepseek_v3",
	aliases: []string{
		"kimi_k2",      // Kimi K2 / K2-Instruct-0905 / K2-Thinking: DeepseekV3ForCausalLM
		"deepseek_v32", // DeepSeek-V3.2: the sparse attention is attention-only
		"kimi_k25",     // Kimi K2.5: K2's text model under text_config
	},
	classes:    []string{"DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"},
	textConfig: []string{"kimi_k25"},
	read:       readDeepSeek,
	dense:      deepseekDense,
	names:      mlpNames,
	whole:      true,
	ggufWhole:  true,
}

// readDeepSeek reads the DeepSeek block's fields. glm4_moe and dots1 are
// DeepSeek-V3's block (sigmoid, noaux_tc, renormalised + 1e-20, ×
// routed_scaling_factor, shared experts, first_k_dense_replace) with their
// configuration classes' defaults: one group, and glm4_moe's
// multi-token-prediction layers stored after the model's.
func readDeepSeek(c *Config, k *keys) error {
	m := &c.MoE
	v3 := c.Family != "deepseek_v2"
	m.NormEps = 1e-20
	m.NumExperts = k.need("n_routed_experts")
	m.Inter = k.need("moe_intermediate_size")
	shared, firstDense := 0, 0
	if c.Family == "glm4_moe" {
		shared, firstDense = 1, 1
	}
	m.SharedInter = k.or("n_shared_experts", shared) * m.Inter
	c.FirstKDense = k.or("first_k_dense_replace", firstDense)
	c.LayerFreq = k.or("moe_layer_freq", 1)
	if c.Family == "glm4_moe" {
		c.MTPLayers = k.or("num_nextn_predict_layers", 0)
	}
	m.RoutedScaling = k.floatOr("routed_scaling_factor", m.RoutedScaling)
	method, scoring := "greedy", "softmax"
	norm := k.Bool("norm_topk_prob")
	m.NormTopK = norm != nil && *norm
	if v3 {
		method, scoring = "noaux_tc", "sigmoid"
		m.NormTopK = norm == nil || *norm
	}
	if c.Family == "dots1" || c.Family == "glm4_moe" {
		// Dots1Config and Glm4MoeConfig define neither topk_method nor
		// scoring_func: the router is noaux_tc over sigmoid scores whatever
		// a release writes there (dots.llm1's says "scoring_func":
		// "noaux_tc", which transformers never reads). Dots1Config's
		// norm_topk_prob defaults to false.
		if c.Family == "dots1" {
			m.NormTopK = norm != nil && *norm
		}
	} else {
		if p := k.Str("topk_method"); p != nil {
			method = *p
		}
		if p := k.Str("scoring_func"); p != nil {
			scoring = *p
		}
	}
	switch method {
	case "greedy":
		m.Method = Greedy
	case "group_limited_greedy":
		m.Method = GroupLimitedGreedy
	case "noaux_tc":
		m.Method = NoAuxTC
		m.ScoreBiasInput = true
	default:
		return fmt.Errorf("unknown topk_method %q (want greedy, group_limited_greedy or noaux_tc)", method)
	}
	var err error
	if m.Scoring, err = parseScoring(scoring); err != nil {
		return err
	}
	if m.Method != Greedy {
		// DeepseekV3Config defaults to 8 groups, 4 kept; V2 has no groups
		// unless told, nor have glm4_moe and dots1.
		defGroups, defKeep := 1, 1
		if c.Family == "deepseek_v3" {
			defGroups, defKeep = 8, 4
		}
		m.NumGroups = k.or("n_group", defGroups)
		m.TopKGroups = k.or("topk_group", min(defKeep, m.NumGroups))
	}
	if c.LayerFreq <= 0 || c.FirstKDense < 0 {
		return fmt.Errorf("moe_layer_freq %d must be positive and first_k_dense_replace %d not negative", c.LayerFreq, c.FirstKDense)
	}
	switch c.Family {
	case "deepseek_v2", "deepseek_v3":
		readMLA(c, k)
	case "glm4_moe":
		// Glm4MoeAttention: q, k and v biases (attention_bias), per-head QK
		// norms when use_qk_norm, RoPE by halves over the first
		// partial_rotary_factor of each head (read with the common keys).
		if k.boolOr("use_qk_norm", false) {
			c.Attention.QKNorm = QKNormHead
		}
	}
	return nil
}

// readMLA reads DeepSeek's multi-head latent attention: q_lora_rank (none:
// a plain q_proj), kv_lora_rank, the heads' no-RoPE and RoPE widths, the
// value width, and rope_scaling (yarn).
func readMLA(c *Config, k *keys) {
	a := &c.Attention
	if !k.has("kv_lora_rank") {
		return
	}
	a.Kind = MLA
	for _, key := range []string{"num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"} {
		if !k.has(key) {
			c.Missing = append(c.Missing, key)
		}
	}
	a.QLoraRank = k.Int("q_lora_rank")
	a.KVLoraRank = k.or("kv_lora_rank", 0)
	a.NopeDim = k.or("qk_nope_head_dim", 0)
	a.RopeDim = k.or("qk_rope_head_dim", 0)
	a.VDim = k.or("v_head_dim", 0)
	a.KVHeads, a.HeadDim = a.Heads, a.NopeDim+a.RopeDim
}

// deepseekDense: the first first_k_dense_replace layers are dense, then
// every moe_layer_freq-th is MoE.
func deepseekDense(c *Config, n int) error {
	if n < c.FirstKDense {
		return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (below first_k_dense_replace %d), not MoE", n, c.FirstKDense)
	}
	if n%c.LayerFreq != 0 {
		return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (not a multiple of moe_layer_freq %d), not MoE", n, c.LayerFreq)
	}
	return nil
}

// deepseekGGUF writes the config.json keys of llama.cpp's deepseek2 and
// glm4moe metadata: expert_count, expert_used_count,
// expert_feed_forward_length, expert_shared_count (× the expert width),
// leading_dense_block_count, expert_weights_scale (routed_scaling_factor,
// default 1), expert_weights_norm (norm_topk_prob, default false),
// expert_gating_func (1 softmax, 2 sigmoid; default softmax; GLM-4.5's
// sigmoid), expert_group_count and expert_group_used_count (n_group,
// topk_group). GGUF keeps no topk_method: a layer with exp_probs_b is
// noaux_tc (DeepSeek-V3's), else groups > 1 mean group_limited_greedy,
// else greedy; glm4moe is always noaux_tc (glm4_moe). block_count includes
// nextn_predict_layers, the MTP layers stored after the model's.
func deepseekGGUF(m *ggufMeta, cfg map[string]any, glm bool) {
	inter := m.num("expert_feed_forward_length")
	groups := m.num("expert_group_count", 1)
	defGating := 1.0
	if glm {
		defGating = 2
	}
	sigmoid := m.num("expert_gating_func", defGating) == 2
	noaux := m.hasTensor(".exp_probs_b.bias")
	method, scoring, model := "greedy", "softmax", "deepseek_v2"
	switch {
	case glm:
		method, model = "noaux_tc", "glm4_moe"
		cfg["num_nextn_predict_layers"] = m.nextn
	case noaux:
		method, model = "noaux_tc", "deepseek_v3"
	case groups > 1:
		method = "group_limited_greedy"
	}
	if sigmoid {
		scoring = "sigmoid"
	}
	if glm {
		// Grouped-query attention: RoPE over rope.dimension_count of each
		// head's key_length; QK norms where the file has their tensors.
		if k, r := m.num("attention.key_length", 0), m.num("rope.dimension_count", 0); k > 0 && r > 0 {
			cfg["partial_rotary_factor"] = r / k
		}
		cfg["use_qk_norm"] = m.hasTensor(".attn_q_norm.weight")
		cfg["attention_bias"] = m.hasTensor(".attn_q.bias")
	} else {
		// MLA: llama.cpp's key_length is nope + rope (key_length_mla where
		// the file has both), q_lora_rank 0 means a plain q_proj.
		if q := m.num("attention.q_lora_rank", 0); q > 0 {
			cfg["q_lora_rank"] = q
		}
		rope := m.num("rope.dimension_count", 0)
		if k := m.num("attention.key_length_mla", m.num("attention.key_length", 0)); k > rope {
			cfg["qk_nope_head_dim"] = k - rope
		}
		if v := m.num("attention.value_length_mla", m.num("attention.value_length", 0)); v > 0 {
			cfg["v_head_dim"] = v
		}
	}
	for k, v := range map[string]any{"model_type": model, "n_routed_experts": m.num("expert_count"),
		"num_experts_per_tok": m.num("expert_used_count"), "moe_intermediate_size": inter,
		"n_shared_experts": m.num("expert_shared_count", 0), "first_k_dense_replace": m.num("leading_dense_block_count", 0),
		"moe_layer_freq": 1, "routed_scaling_factor": m.num("expert_weights_scale", 1),
		"norm_topk_prob": m.num("expert_weights_norm", 0) == 1, "scoring_func": scoring, "topk_method": method,
		"n_group": groups, "topk_group": m.num("expert_group_used_count", 1),
		"kv_lora_rank": m.num("attention.kv_lora_rank", 0), "qk_rope_head_dim": m.num("rope.dimension_count", 0)} {
		cfg[k] = v
	}
}

// parseScoring reads a scoring_func.
func parseScoring(s string) (Scoring, error) {
	switch s {
	case "softmax":
		return Softmax, nil
	case "sigmoid":
		return Sigmoid, nil
	case "sqrtsoftplus":
		return SqrtSoftplus, nil
	}
	return 0, fmt.Errorf("unknown scoring_func %q (want softmax, sigmoid or sqrtsoftplus)", s)
}
