package arch

import "fmt"

// OLMoE (transformers' modeling_olmoe.py): softmax, top-k, renormalised iff
// norm_topk_prob (false by default and in the released models); every
// layer MoE, mlp.{gate, experts.N.gate_proj/up_proj/down_proj}.
var olmoe = &family{
	name:    "olmoe",
	classes: []string{"OlmoeForCausalLM"},
	read: func(c *Config, k *keys) error {
		m := &c.MoE
		m.NumExperts = k.need("num_experts")
		m.Inter = k.need("intermediate_size")
		c.DenseInter = 0
		m.NormTopK = k.boolOr("norm_topk_prob", false)
		// OlmoeAttention: q_norm and k_norm over all the heads' queries and
		// keys at once; clip_qkv clamps the projections.
		c.Attention.QKNorm = QKNormWhole
		if p := k.Float("clip_qkv"); p != nil {
			c.Attention.Unsupported = fmt.Sprintf("clip_qkv %v (clamped q, k and v projections) is not built yet", *p)
		}
		return nil
	},
	names:     mlpNames,
	whole:     true,
	ggufWhole: true,
	gguf:      []string{"olmoe"},
	fromGGUF: func(m *ggufMeta, cfg map[string]any) error {
		// llama.cpp's olmoe: softmax top-k, not renormalised; q_norm and
		// k_norm over all the heads (attn_q_norm [hidden]).
		cfg["model_type"] = "olmoe"
		cfg["num_experts"] = m.num("expert_count")
		cfg["num_experts_per_tok"] = m.num("expert_used_count")
		cfg["intermediate_size"] = m.num("expert_feed_forward_length")
		cfg["norm_topk_prob"] = false
		return nil
	},
}
