package arch

import (
	"fmt"
	"strings"

	"github.com/moex-project/moex/kernels"
)

// gpt-oss (transformers' modeling_gpt_oss.py): num_local_experts
// (num_experts an alias), top-k on the biased logits then softmax over the
// k (= softmax, top-k, renormalise), experts with biases and the clamped
// SwiGLU (alpha 1.702, a constant of the model; limit swiglu_limit, 7);
// every layer MoE; the experts fused, gate and up interleaved (MXFP4 as
// released, or x·W form).
var gptOss = &family{
	name:    "gpt_oss",
	classes: []string{"GptOssForCausalLM"},
	read: func(c *Config, k *keys) error {
		m := &c.MoE
		if k.has("num_local_experts") {
			m.NumExperts = k.need("num_local_experts")
		} else if k.has("num_experts") {
			m.NumExperts = k.need("num_experts")
		} else {
			m.NumExperts = k.need("num_local_experts")
		}
		m.Inter = k.need("intermediate_size")
		c.DenseInter = 0
		m.NormTopK = true
		m.RouterBias, m.ExpertBias = true, true
		m.Act = kernels.Activation{Kind: kernels.ClampedSwiGLU, Alpha: 1.702, Limit: float32(k.floatOr("swiglu_limit", 7))}
		// GptOssAttention: biases on q, k, v and o (attention_bias), a
		// learned sink per head, a sliding window on the layers layer_types
		// marks sliding_attention.
		a := &c.Attention
		a.Bias = k.boolOr("attention_bias", true)
		a.OutBias, a.Sinks = a.Bias, true
		a.Window = k.or("sliding_window", 0)
		if types := k.Strs("layer_types"); types != nil {
			if c.Layers > 0 && len(types) != c.Layers {
				return fmt.Errorf("layer_types has %d entries, num_hidden_layers is %d", len(types), c.Layers)
			}
			a.WindowLayers = make([]bool, len(types))
			for i, t := range types {
				switch t {
				case "sliding_attention":
					a.WindowLayers[i] = true
				case "full_attention":
				default:
					return fmt.Errorf("layer_types[%d] is %q (want sliding_attention or full_attention)", i, t)
				}
			}
		} else if a.Window > 0 { // GptOssConfig's default: sliding, full, sliding, …
			a.WindowLayers = make([]bool, c.Layers)
			for i := range a.WindowLayers {
				a.WindowLayers[i] = i%2 == 0
			}
		}
		return nil
	},
	whole:     true,
	ggufWhole: true,
	ggufNames: func(n *LayerNames) { // llama.cpp's openai_moe: the norm after attention is post_attention_norm
		n.PostNorm = strings.Replace(n.PostNorm, "ffn_norm", "post_attention_norm", 1)
	},
	names: func(c *Config, root string, layer int) MoENames {
		p := fmt.Sprintf("%slayers.%d.mlp.", root, layer)
		var n MoENames
		n.Gate, n.RouterBias, n.Fused, n.Layout = p+"router.weight", p+"router.bias", p+"experts.", FusedGptOss
		return n
	},
	gguf: []string{"gpt-oss"},
	fromGGUF: func(m *ggufMeta, cfg map[string]any) error {
		// The router and experts' biases as ffn_*.bias, the clamped SwiGLU
		// at its default limit of 7.
		cfg["model_type"] = "gpt_oss"
		cfg["num_local_experts"] = m.num("expert_count")
		cfg["num_experts_per_tok"] = m.num("expert_used_count")
		cfg["intermediate_size"] = m.num("expert_feed_forward_length")
		return nil
	},
}
