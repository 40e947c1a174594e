package moetest

// GQAFamilies: a whole model of each grouped-query family moex runs, with
// what sets its attention apart: Qwen3-MoE's per-head QK norms and a dense
// first layer (mlp_only_layers), Qwen2-MoE's q/k/v biases and gated shared
// expert, Mixtral's sliding window over one key/value head, OLMoE's QK
// norms over all heads, gpt-oss's biases, sinks, yarn RoPE and a window on
// every other layer. Their names say the dtype; GGUFArch gives each
// one's llama.cpp architecture.
func GQAFamilies() map[string]WholeSpec {
	return map[string]WholeSpec{
		"qwen3_moe_f32": {
			MoE:    Spec{ModelType: "qwen3_moe", Experts: 8, TopK: 2, Inter: 16, NormTopK: true, DType: "F32"},
			GQA:    &GQASpec{Heads: 4, KVHeads: 2, HeadDim: 8, QKNorm: "head", Theta: 1e6},
			Hidden: 32, Layers: 3, FirstKDense: 1, Vocab: 40, DenseInter: 24, Seed: 11,
		},
		"qwen3_moe_f32_head12": { // a head_dim that is not a power of two, 6 query heads over 2
			MoE:    Spec{ModelType: "qwen3_moe", Experts: 6, TopK: 3, Inter: 12, NormTopK: true, DType: "F32"},
			GQA:    &GQASpec{Heads: 6, KVHeads: 2, HeadDim: 12, QKNorm: "head", Theta: 1e6},
			Hidden: 24, Layers: 2, Vocab: 29, DenseInter: 1, Seed: 17,
		},
		"qwen2_moe_bf16": {
			MoE:    Spec{ModelType: "qwen2_moe", Experts: 6, TopK: 2, Inter: 12, SharedInter: 16, DType: "BF16"},
			GQA:    &GQASpec{Heads: 4, KVHeads: 4, HeadDim: 8, Bias: true, Theta: 1e6},
			Hidden: 32, Layers: 2, FirstKDense: 1, Vocab: 30, DenseInter: 20, Seed: 12,
		},
		"mixtral_f32_window": {
			MoE:    Spec{ModelType: "mixtral", Experts: 4, TopK: 2, Inter: 16, DType: "F32"},
			GQA:    &GQASpec{Heads: 4, KVHeads: 1, HeadDim: 8, Window: 5, Theta: 1e6},
			Hidden: 24, Layers: 2, Vocab: 33, DenseInter: 1, Seed: 13,
		},
		"olmoe_bf16": {
			MoE:    Spec{ModelType: "olmoe", Experts: 8, TopK: 2, Inter: 16, DType: "BF16"},
			GQA:    &GQASpec{Heads: 2, KVHeads: 2, HeadDim: 16, QKNorm: "whole", Theta: 10000},
			Hidden: 32, Layers: 2, Vocab: 35, DenseInter: 1, Seed: 14,
		},
		"glm4_moe_f32": {
			MoE: Spec{ModelType: "glm4_moe", Experts: 8, TopK: 2, Inter: 16, SharedExperts: 1, NGroup: 1, TopKGroup: 1,
				NormTopK: true, Scaling: 2.5, DType: "F32"},
			GQA:    &GQASpec{Heads: 4, KVHeads: 2, HeadDim: 16, Bias: true, QKNorm: "head", Partial: 0.5, Theta: 10000},
			Hidden: 32, Layers: 3, FirstKDense: 1, Vocab: 41, DenseInter: 24, Seed: 16,
		},
		"gpt_oss_bf16": {
			MoE: Spec{ModelType: "gpt_oss", Experts: 4, TopK: 2, Inter: 16, DType: "BF16"},
			GQA: &GQASpec{Heads: 4, KVHeads: 2, HeadDim: 8, Bias: true, OutBias: true, Sinks: true, Window: 4, WindowEven: true,
				Yarn: true, Theta: 150000},
			Hidden: 32, Layers: 2, Vocab: 37, DenseInter: 1, Seed: 15,
		},
	}
}

// GGUFArch is the llama.cpp architecture of each of GQAFamilies.
var GGUFArch = map[string]string{"qwen3_moe_f32": "qwen3moe", "qwen3_moe_f32_head12": "qwen3moe", "qwen2_moe_bf16": "qwen2moe",
	"mixtral_f32_window": "llama", "gpt_oss_bf16": "gpt-oss", "glm4_moe_f32": "glm4moe", "olmoe_bf16": "olmoe"}

// ForGGUF is spec as a GGUF file of architecture arch can hold it, as
// llama.cpp computes it: no dense layers (llama.cpp's MoE architectures
// have none, but GLM-4.5's), no sliding window for llama (Mixtral ships
// none), yarn's ramp bounds rounded (ggml always rounds them).
func ForGGUF(spec WholeSpec, arch string) WholeSpec {
	if arch != "glm4moe" {
		spec.FirstKDense = 0
	}
	if spec.GQA != nil {
		g := *spec.GQA
		if arch == "llama" {
			g.Window = 0
		}
		g.YarnTruncate = true
		spec.GQA = &g
	}
	return spec
}
