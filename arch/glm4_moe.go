package arch

import "strings"

// GLM-4.5 and GLM-4.6 (transformers' modeling_glm4_moe.py): DeepSeek-V3's
// MoE block (sigmoid, noaux_tc, one group, a shared expert), its first
// layer dense by default, and num_nextn_predict_layers MTP layers stored
// after the model's (not layers of the model: skipped). Grouped-query
// attention with q/k/v biases, optional per-head QK norms and RoPE by
// halves over half of each head (partial_rotary_factor 0.5). GLM-5 (glm_moe_dsa) runs the same block; its sparse
// attention is attention-only.
var glm4MoE = &family{
	name:      "glm4_moe",
	aliases:   []string{"glm_moe_dsa"},
	classes:   []string{"Glm4MoeForCausalLM", "GlmMoeDsaForCausalLM"},
	read:      readDeepSeek,
	dense:     deepseekDense,
	names:     mlpNames,
	whole:     true,
	ggufWhole: true,
	ggufNames: func(n *LayerNames) { // llama.cpp's glm4moe: the norm after attention is post_attention_norm
		n.PostNorm = strings.Replace(n.PostNorm, "ffn_norm", "post_attention_norm", 1)
	},
	gguf: []string{"glm4moe"},
	fromGGUF: func(m *ggufMeta, cfg map[string]any) error {
		deepseekGGUF(m, cfg, true)
		return nil
	},
}
