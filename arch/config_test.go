package arch_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/kernels"
)

func parse(t *testing.T, fields map[string]any) (*arch.Config, error) {
	t.Helper()
	b, err := json.Marshal(fields)
	require.NoError(t, err)
	return arch.Parse(b)
}

// deepseekV2Lite is DeepSeek-V2-Lite's config.json, MoE fields only.
func deepseekV2Lite() map[string]any {
	return map[string]any{
		"model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27,
		"n_routed_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 1408,
		"n_shared_experts": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
		"topk_method": "greedy", "n_group": 1, "topk_group": 1, "norm_topk_prob": false,
		"routed_scaling_factor": 1.0, "scoring_func": "softmax",
	}
}

func TestParseConfigFamilies(t *testing.T) {
	c, err := parse(t, deepseekV2Lite())
	require.NoError(t, err)
	require.Equal(t, 2*1408, c.MoE.SharedInter)
	require.Equal(t, arch.Greedy, c.MoE.Method)
	require.Equal(t, arch.Softmax, c.MoE.Scoring)
	require.False(t, c.MoE.NormTopK)

	// DeepSeek-V3 leaves the routing fields to their defaults here.
	c, err = parse(t, map[string]any{"model_type": "deepseek_v3", "hidden_size": 7168, "n_routed_experts": 256,
		"num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1, "n_group": 8, "topk_group": 4,
		"routed_scaling_factor": 2.5})
	require.NoError(t, err)
	require.Equal(t, arch.NoAuxTC, c.MoE.Method)
	require.Equal(t, arch.Sigmoid, c.MoE.Scoring)
	require.True(t, c.MoE.NormTopK, "deepseek_v3 renormalises by default")
	require.Equal(t, 2.5, c.MoE.RoutedScaling)
	c, err = parse(t, map[string]any{"model_type": "deepseek_v3", "hidden_size": 64, "n_routed_experts": 16,
		"num_experts_per_tok": 4, "moe_intermediate_size": 32})
	require.NoError(t, err)
	require.Equal(t, [2]int{8, 4}, [2]int{c.MoE.NumGroups, c.MoE.TopKGroups}, "DeepseekV3Config's group defaults")

	c, err = parse(t, map[string]any{"model_type": "mixtral", "hidden_size": 4096, "num_local_experts": 8,
		"num_experts_per_tok": 2, "intermediate_size": 14336})
	require.NoError(t, err)
	require.True(t, c.MoE.NormTopK)
	require.Zero(t, c.MoE.SharedInter)

	c, err = parse(t, map[string]any{"model_type": "qwen2_moe", "hidden_size": 2048, "num_experts": 60,
		"num_experts_per_tok": 4, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632})
	require.NoError(t, err)
	require.False(t, c.MoE.NormTopK, "qwen2_moe's norm_topk_prob defaults to false")
	require.True(t, c.MoE.SharedGate)
	require.Equal(t, 1, c.SparseStep)
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name   string
		change map[string]any
		err    string
	}{
		{"unknown model_type", map[string]any{"model_type": "llama"}, `unknown model_type "llama"`},
		{"no model_type", map[string]any{"model_type": nil}, "no model_type"},
		{"missing size", map[string]any{"hidden_size": nil}, "missing [hidden_size]"},
		{"top_k larger than experts", map[string]any{"num_experts_per_tok": 65}, "num_experts_per_tok 65 is larger than the 64 experts"},
		{"zero top_k", map[string]any{"num_experts_per_tok": 0}, "num_experts_per_tok is 0, must be positive"},
		{"n_group not dividing", map[string]any{"topk_method": "group_limited_greedy", "n_group": 5, "topk_group": 2}, "n_group 5 does not divide the 64 experts"},
		{"too few experts in kept groups", map[string]any{"topk_method": "group_limited_greedy", "n_group": 16, "topk_group": 1}, "topk_group 1 × 4 experts per group = 4 is fewer than num_experts_per_tok 6"},
		{"topk_group above n_group", map[string]any{"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 5}, "topk_group 5 must be between 1 and n_group 4"},
		{"unknown topk_method", map[string]any{"topk_method": "random"}, `unknown topk_method "random"`},
		{"unknown scoring_func", map[string]any{"scoring_func": "relu"}, `unknown scoring_func "relu"`},
		{"bad scaling", map[string]any{"routed_scaling_factor": -1}, "routed_scaling_factor -1 must be positive"},
		{"no layers", map[string]any{"num_hidden_layers": 0}, "num_hidden_layers is 0, must be positive"},
		{"not JSON", nil, "not a valid config.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.change == nil {
				_, err = arch.Parse([]byte("{"))
			} else {
				f := deepseekV2Lite()
				for k, v := range tt.change {
					if v == nil {
						delete(f, k)
					} else {
						f[k] = v
					}
				}
				_, err = parse(t, f)
			}
			require.ErrorContains(t, err, tt.err)
		})
	}
}

func TestCheckMoELayer(t *testing.T) {
	ds, err := parse(t, deepseekV2Lite())
	require.NoError(t, err)
	require.ErrorContains(t, ds.MoELayer(0), "layer 0 is a dense MLP layer (below first_k_dense_replace 1)")
	require.NoError(t, ds.MoELayer(1))
	require.NoError(t, ds.MoELayer(26))
	require.ErrorContains(t, ds.MoELayer(27), "layer 27 out of range: the model has 27 layers")
	require.ErrorContains(t, ds.MoELayer(-1), "out of range")

	f := deepseekV2Lite()
	f["moe_layer_freq"] = 2
	ds, err = parse(t, f)
	require.NoError(t, err)
	require.ErrorContains(t, ds.MoELayer(3), "not a multiple of moe_layer_freq 2")
	require.NoError(t, ds.MoELayer(4))

	q, err := parse(t, map[string]any{"model_type": "qwen3_moe", "hidden_size": 8, "num_experts": 4, "num_hidden_layers": 8,
		"num_experts_per_tok": 2, "moe_intermediate_size": 8, "decoder_sparse_step": 2, "mlp_only_layers": []int{3}})
	require.NoError(t, err)
	require.ErrorContains(t, q.MoELayer(0), "layer 0 is a dense MLP layer (decoder_sparse_step 2")
	require.NoError(t, q.MoELayer(1))
	require.ErrorContains(t, q.MoELayer(3), "layer 3 is a dense MLP layer (in mlp_only_layers)")
	require.NoError(t, q.MoELayer(5))
}

// TestParseConfigGptOss: gpt-oss-20b's config.json (MoE fields and its
// quantization_config) and the defaults GptOssConfig gives.
func TestParseConfigGptOss(t *testing.T) {
	c, err := parse(t, map[string]any{"model_type": "gpt_oss", "architectures": []string{"GptOssForCausalLM"},
		"hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24, "num_local_experts": 32,
		"num_experts_per_tok": 4, "experts_per_token": 4, "swiglu_limit": 7.0,
		"quantization_config": map[string]any{"quant_method": "mxfp4", "modules_to_not_convert": []string{
			"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}})
	require.NoError(t, err)
	require.Equal(t, [4]int{2880, 2880, 32, 4}, [4]int{c.Hidden, c.MoE.Inter, c.MoE.NumExperts, c.MoE.TopK})
	require.Equal(t, arch.Softmax, c.MoE.Scoring)
	require.Equal(t, arch.Greedy, c.MoE.Method)
	require.True(t, c.MoE.NormTopK, "softmax over the k chosen logits")
	require.Zero(t, c.MoE.NormEps)
	require.True(t, c.MoE.RouterBias && c.MoE.ExpertBias)
	require.Equal(t, kernels.Activation{Kind: kernels.ClampedSwiGLU, Alpha: 1.702, Limit: 7}, c.MoE.Act)
	require.Equal(t, "mxfp4", c.Quant.Method)
	for module, want := range map[string]string{
		"model.layers.3.mlp.router":               `modules_to_not_convert "model.layers.*.mlp.router"`,
		"model.layers.17.self_attn.q_proj":        `modules_to_not_convert "model.layers.*.self_attn"`,
		"lm_head":                                 `modules_to_not_convert "lm_head"`,
		"model.layers.3.mlp.experts.gate_up_proj": "",
		"model.layers.3.mlp.routers":              "",
		"model.layers.3.mlp.router_bias":          "",
	} {
		got, ok := c.Quant.Unquantized(module)
		require.Equal(t, want != "", ok, module)
		require.Equal(t, want, got, module)
	}

	// experts_per_token alone; swiglu_limit's default.
	c, err = parse(t, map[string]any{"model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 32,
		"num_experts": 8, "experts_per_token": 2})
	require.NoError(t, err)
	require.Equal(t, [3]int{8, 2, 32}, [3]int{c.MoE.NumExperts, c.MoE.TopK, c.MoE.Inter})
	require.Equal(t, float32(7), c.MoE.Act.Limit)
}

// TestParseConfigQwen35: Qwen3.6-35B-A3B's config.json (its text_config's
// MoE fields) and Qwen3-Next's default renormalisation.
func TestParseConfigQwen35(t *testing.T) {
	c, err := parse(t, map[string]any{"model_type": "qwen3_5_moe", "architectures": []string{"Qwen3_5MoeForConditionalGeneration"},
		"text_config": map[string]any{"model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40,
			"num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512}})
	require.NoError(t, err)
	require.Equal(t, "qwen3_5_moe", c.MoE.ModelType)
	require.Equal(t, [5]int{2048, 40, 256, 8, 512}, [5]int{c.Hidden, c.Layers, c.MoE.NumExperts, c.MoE.TopK, c.MoE.Inter})
	require.True(t, c.MoE.NormTopK, "always renormalised")
	require.Equal(t, 512, c.MoE.SharedInter)
	require.True(t, c.MoE.SharedGate)
	for n := range 40 {
		require.NoError(t, c.MoELayer(n), "every layer is MoE")
	}
	_, err = parse(t, map[string]any{"model_type": "qwen3_5_moe", "hidden_size": 2048})
	require.ErrorContains(t, err, "qwen3_5_moe config.json has no text_config")

	c, err = parse(t, map[string]any{"model_type": "qwen3_next", "hidden_size": 2048, "num_experts": 512,
		"num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512})
	require.NoError(t, err)
	require.True(t, c.MoE.NormTopK, "Qwen3NextConfig's norm_topk_prob defaults to true")
	require.True(t, c.MoE.SharedGate)
}

// TestReleasedConfigs: keys as the releases spell them, read as
// transformers reads them.
func TestReleasedConfigs(t *testing.T) {
	// dots.llm1.inst: "scoring_func": "noaux_tc", a key Dots1Config does
	// not define; its router is sigmoid noaux_tc, unnormalised by default.
	c, err := parse(t, map[string]any{"model_type": "dots1", "hidden_size": 4096, "num_hidden_layers": 62, "n_routed_experts": 128,
		"num_experts_per_tok": 6, "moe_intermediate_size": 1408, "n_shared_experts": 2, "first_k_dense_replace": 1,
		"scoring_func": "noaux_tc", "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1})
	require.NoError(t, err)
	require.Equal(t, arch.Sigmoid, c.MoE.Scoring)
	require.Equal(t, arch.NoAuxTC, c.MoE.Method)
	require.False(t, c.MoE.NormTopK)

	// Mixtral ships "sliding_window": null; Qwen2-MoE a window beside
	// "use_sliding_window": false: neither has one.
	c, err = parse(t, map[string]any{"model_type": "mixtral", "hidden_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
		"intermediate_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": nil})
	require.NoError(t, err)
	require.Zero(t, c.Attention.LayerWindow(0))
	c, err = parse(t, map[string]any{"model_type": "qwen2_moe", "hidden_size": 64, "num_experts": 4, "num_experts_per_tok": 2,
		"moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "num_attention_heads": 4, "sliding_window": 4096,
		"use_sliding_window": false, "num_hidden_layers": 2})
	require.NoError(t, err)
	require.Zero(t, c.Attention.LayerWindow(1))
	require.True(t, c.Attention.Bias, "Qwen2-MoE's q, k and v have biases")

	// gpt-oss-20b's attention: yarn with truncate false, a window on the
	// layers layer_types marks.
	c, err = parse(t, map[string]any{"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 2, "num_local_experts": 32,
		"num_experts_per_tok": 4, "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
		"sliding_window": 128, "layer_types": []string{"sliding_attention", "full_attention"}, "attention_bias": true,
		"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
			"original_max_position_embeddings": 4096, "truncate": false}})
	require.NoError(t, err)
	a := c.Attention
	require.Equal(t, [2]int{128, 0}, [2]int{a.LayerWindow(0), a.LayerWindow(1)})
	require.True(t, a.Bias && a.OutBias && a.Sinks)
	require.Equal(t, "yarn", a.RoPE.Scaling.Type)
	require.False(t, *a.RoPE.Scaling.Truncate)
	require.NoError(t, c.WholeModel())
}
