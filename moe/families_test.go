package moe_test

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// TestGptOssLoadErrors: what is wrong with a gpt-oss checkpoint is an
// error naming the tensor and the problem.
func TestGptOssLoadErrors(t *testing.T) {
	spec := moetest.Spec{ModelType: "gpt_oss", Hidden: 32, Experts: 4, TopK: 2, Inter: 32, DType: "MXFP4", Seed: 60}
	const p = "model.layers.0.mlp."
	checkLoadErrors(t, spec, []loadError{
		{"blocks misshapen", func(m *moetest.Model) {
			st := find(m, p+"experts.gate_up_proj_blocks")
			st.Shape = []int{4, 64, 2, 8}
		}, `tensor "` + p + `experts.gate_up_proj_blocks" has shape [4 64 2 8], the config needs [4 64 1 16]`, moe.ErrShape},
		{"blocks of another dtype", func(m *moetest.Model) { find(m, p+"experts.down_proj_blocks").DType = "I8" },
			`tensor "` + p + `experts.down_proj_blocks" has dtype I8, want [U8]`, moe.ErrUnsupportedFormat},
		{"scales missing", func(m *moetest.Model) { drop(m, p+"experts.down_proj_scales") },
			`missing tensor "` + p + `experts.down_proj_scales" (the scales of ` + p + `experts.down_proj_blocks)`, moe.ErrMissingTensor},
		{"NaN scale", func(m *moetest.Model) { find(m, p+"experts.gate_up_proj_scales").Data[2*64+5] = 0xFF },
			`tensor "` + p + `experts.gate_up_proj_scales" of expert 2: kernels: mxfp4 scale [2, 0] is the E8M0 NaN 0xff`, moe.ErrUnsupportedFormat},
		{"no quantization_config", func(m *moetest.Model) { delete(m.Config, "quantization_config") },
			`tensor "` + p + `experts.gate_up_proj_blocks" holds MXFP4 blocks but config.json has no mxfp4 quantization_config`, moe.ErrUnsupportedFormat},
		{"experts listed as not converted", func(m *moetest.Model) {
			m.Config["quantization_config"].(map[string]any)["modules_to_not_convert"] = []string{"model.layers.*.mlp.experts"}
		}, `tensor "` + p + `experts.gate_up_proj" is stored MXFP4 (` + p + `experts.gate_up_proj_blocks) but quantization_config's modules_to_not_convert "model.layers.*.mlp.experts" leaves module`, moe.ErrUnsupportedFormat},
		{"router bias missing", func(m *moetest.Model) { drop(m, p+"router.bias") },
			`missing tensor "` + p + `router.bias"`, moe.ErrMissingTensor},
		{"NaN expert bias", func(m *moetest.Model) {
			st := find(m, p+"experts.gate_up_proj_bias")
			st.Data[2*(3*64+9)], st.Data[2*(3*64+9)+1] = 0xC0, 0x7F // bf16 NaN at [3, 9]
		}, `tensor "` + p + `experts.gate_up_proj_bias" [3, 9] is NaN`, moe.ErrNonFinite},
		{"infinite router bias", func(m *moetest.Model) {
			st := find(m, p+"router.bias")
			st.Data[2], st.Data[3] = 0x80, 0x7F // bf16 +Inf at [1]
		}, `tensor "` + p + `router.bias" [0, 1] is +Inf`, moe.ErrNonFinite},
		{"bias misshapen", func(m *moetest.Model) { find(m, p+"experts.down_proj_bias").Shape = []int{32, 4} },
			`tensor "` + p + `experts.down_proj_bias" has shape [32 4], the config needs [4 32]`, moe.ErrMissingTensor},
	})
	dense := moetest.Spec{ModelType: "gpt_oss", Hidden: 16, Experts: 3, TopK: 2, Inter: 12, DType: "BF16", Seed: 61}
	checkLoadErrors(t, dense, []loadError{
		{"down in another dtype", func(m *moetest.Model) {
			st := find(m, p+"experts.down_proj")
			st.DType = "F16"
		}, `tensor "` + p + `experts.down_proj" has dtype F16, want [BF16]`, moe.ErrUnsupportedFormat},
		{"gate_up in [out, in] form", func(m *moetest.Model) { find(m, p+"experts.gate_up_proj").Shape = []int{3, 24, 16} },
			`tensor "` + p + `experts.gate_up_proj" has shape [3 24 16], the config needs [3 16 24]`, moe.ErrShape},
		{"negative swiglu_limit", func(m *moetest.Model) { m.Config["swiglu_limit"] = -1.0 },
			`swiglu_limit: kernels: clamped SwiGLU needs a positive finite limit`, nil},
		{"no experts", func(m *moetest.Model) { delete(m.Config, "num_local_experts") },
			`gpt_oss config.json is missing [num_local_experts]`, nil},
	})
}

// TestGptOssForward: the layer is batch independent and refuses what the
// device kernels cannot run.
func TestGptOssForward(t *testing.T) {
	spec := moetest.Spec{ModelType: "gpt_oss", Hidden: 64, Experts: 8, TopK: 4, Inter: 32, DType: "MXFP4", Seed: 62}
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, m.WriteTo(dir))
	l, err := moe.Load(dir, 0)
	require.NoError(t, err)
	defer l.Close()
	require.Equal(t, kernels.MXFP4, l.WeightDType())
	x := moetest.Input(9, 12, spec.Hidden, false)
	y := make([]float32, len(x))
	require.NoError(t, l.Forward(context.Background(), x, y))
	require.LessOrEqual(t, moetest.RelErr(y, m.Forward(x).Y), 1e-5)
	for _, tok := range []int{0, 5, 11} {
		one := make([]float32, spec.Hidden)
		require.NoError(t, l.Forward(context.Background(), x[tok*64:(tok+1)*64], one))
		for i := range one {
			require.Equal(t, math.Float32bits(y[tok*64+i]), math.Float32bits(one[i]), "token %d alone", tok)
		}
	}
	e, ok := l.Expert(3)
	require.True(t, ok)
	require.Len(t, e.GateBias, spec.Inter)
	require.Len(t, e.DownBias, spec.Hidden)
	require.Len(t, l.Router.LogitBias(), spec.Experts)
}

// TestQwen35LoadErrors: Qwen3.5's multimodal config and fused tensors.
func TestQwen35LoadErrors(t *testing.T) {
	spec := moetest.Spec{ModelType: "qwen3_5_moe", Hidden: 16, Experts: 4, TopK: 2, Inter: 4, SharedInter: 8, DType: "BF16", Seed: 63}
	const p = "model.language_model.layers.0.mlp."
	checkLoadErrors(t, spec, []loadError{
		{"no text_config", func(m *moetest.Model) { delete(m.Config, "text_config") },
			`qwen3_5_moe config.json has no text_config`, nil},
		{"gate_up transposed", func(m *moetest.Model) { find(m, p+"experts.gate_up_proj").Shape = []int{4, 16, 8} },
			`tensor "` + p + `experts.gate_up_proj" has shape [4 16 8], the config needs [4 8 16]`, moe.ErrShape},
		{"down missing", func(m *moetest.Model) { drop(m, p+"experts.down_proj") },
			`missing tensor "` + p + `experts.down_proj"`, moe.ErrMissingTensor},
		{"down of another dtype", func(m *moetest.Model) { find(m, p+"experts.down_proj").DType = "F16" },
			`tensor "` + p + `experts.down_proj" has dtype F16, want [BF16]`, moe.ErrUnsupportedFormat},
	})
}

// TestDeepSeekV3Aliases: Kimi K2 and DeepSeek-V3.2 checkpoints (their own
// model_type, DeepSeek-V3's block and tensor names), and a model type moex
// does not know whose architectures it does.
func TestDeepSeekV3Aliases(t *testing.T) {
	for _, extra := range []map[string]any{
		{"model_type": "kimi_k2", "architectures": []string{"DeepseekV3ForCausalLM"}},
		{"model_type": "deepseek_v32", "architectures": []string{"DeepseekV32ForCausalLM"}},
		{"model_type": "some_finetune", "architectures": []string{"DeepseekV3ForCausalLM"}},
	} {
		spec := moetest.Spec{ModelType: "deepseek_v3", Hidden: 32, Experts: 8, TopK: 2, Inter: 16, SharedExperts: 1,
			Method: "noaux_tc", Scoring: "sigmoid", NGroup: 2, TopKGroup: 1, NormTopK: true, Scaling: 2.827, DType: "BF16",
			Seed: 64, Extra: extra}
		m, err := moetest.Generate(spec)
		require.NoError(t, err)
		dir := t.TempDir()
		require.NoError(t, m.WriteTo(dir))
		l, err := moe.Load(dir, 0)
		require.NoError(t, err)
		require.Equal(t, "deepseek_v3", l.Config.ModelType)
		require.Equal(t, extra["model_type"], l.Config.Name)
		x := moetest.Input(3, 7, spec.Hidden, false)
		y := make([]float32, len(x))
		ids := make([]int32, 7*spec.TopK)
		require.NoError(t, l.ForwardRouting(context.Background(), x, y, ids, nil))
		ref := m.Forward(x)
		require.Equal(t, ref.IDs, ids)
		require.LessOrEqual(t, moetest.RelErr(y, ref.Y), 1e-5)
		l.Close()
	}
	_, err := moe.ParseConfig([]byte(`{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_experts_per_tok": 1}`))
	require.ErrorIs(t, err, moe.ErrUnknownFamily)
	require.ErrorContains(t, err, `unknown model_type "llama", architectures [LlamaForCausalLM] (supported: [mixtral`)
	require.ErrorContains(t, err, "deepseek_v32 as deepseek_v3, gemma4_text as gemma4, glm_moe_dsa as glm4_moe, kimi_k2 as deepseek_v3, kimi_k25 as deepseek_v3")
}

// TestWrappedAliases: Kimi K2.5 (K2's text model under text_config, the
// tensors under language_model.model.) and GLM-5 (glm_moe_dsa, GLM-4.5's
// block).
func TestWrappedAliases(t *testing.T) {
	k25 := moetest.Spec{ModelType: "deepseek_v3", Hidden: 32, Experts: 8, TopK: 2, Inter: 16, SharedExperts: 1,
		Method: "noaux_tc", Scoring: "sigmoid", NGroup: 1, TopKGroup: 1, NormTopK: true, Scaling: 2.827, DType: "BF16", Seed: 73}
	glm5 := moetest.Spec{ModelType: "glm4_moe", Hidden: 32, Experts: 8, TopK: 2, Inter: 16, SharedExperts: 1, NGroup: 1, TopKGroup: 1,
		NormTopK: true, Scaling: 2.5, DType: "BF16", Seed: 74,
		Extra: map[string]any{"model_type": "glm_moe_dsa", "architectures": []string{"GlmMoeDsaForCausalLM"}}}
	// K2.5 as released: the routed experts int4 (compressed-tensors'
	// pack-quantized), the quantization_config beside text_config.
	k25int4 := k25
	k25int4.Hidden, k25int4.Inter, k25int4.DType, k25int4.Seed = 64, 32, "INT4", 75
	for _, spec := range []moetest.Spec{k25, k25int4, glm5} {
		m, err := moetest.Generate(spec)
		require.NoError(t, err)
		want := spec.ModelType
		if spec.ModelType == "deepseek_v3" {
			text := m.Config
			text["model_type"] = "kimi_k2"
			m.Config = map[string]any{"model_type": "kimi_k25", "architectures": []string{"KimiK25ForConditionalGeneration"}, "text_config": text}
			if q, ok := text["quantization_config"]; ok {
				m.Config["quantization_config"] = q
				delete(text, "quantization_config")
			}
			for i := range m.Tensors {
				m.Tensors[i].Name = "language_model." + m.Tensors[i].Name
			}
		}
		dir := t.TempDir()
		require.NoError(t, m.WriteTo(dir))
		l, err := moe.Load(dir, 0)
		require.NoError(t, err)
		require.Equal(t, want, l.Config.ModelType)
		if spec.DType == "INT4" {
			require.Equal(t, kernels.INT4, l.WeightDType())
		}
		x := moetest.Input(4, 9, spec.Hidden, false)
		y := make([]float32, len(x))
		ids := make([]int32, 9*spec.TopK)
		require.NoError(t, l.ForwardRouting(context.Background(), x, y, ids, nil))
		ref := m.Forward(x)
		require.Equal(t, ref.IDs, ids)
		require.LessOrEqual(t, moetest.RelErr(y, ref.Y), 1e-5)
		l.Close()
	}
}

// TestNewFamiliesLoadErrors: the layers the new families' configs make
// dense or leave out, their fused x·W tensors and their bias shapes are
// errors naming the problem.
func TestNewFamiliesLoadErrors(t *testing.T) {
	glm := moetest.Spec{ModelType: "glm4_moe", Hidden: 16, Experts: 4, TopK: 2, Inter: 8, SharedExperts: 1, NGroup: 1, TopKGroup: 1,
		NormTopK: true, Scaling: 2.5, NumLayers: 2, Layer: 1, FirstKDense: 1, DType: "BF16", Seed: 70}
	m, err := moetest.Generate(glm)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, m.WriteTo(dir))
	_, err = moe.Load(dir, 2)
	require.ErrorContains(t, err, "layer 2 is a multi-token-prediction layer (num_nextn_predict_layers 1, stored after the model's 2 layers), not a layer of the model")
	_, err = moe.Load(dir, 0)
	require.ErrorIs(t, err, moe.ErrDenseLayer)
	require.ErrorContains(t, err, "below first_k_dense_replace 1")

	ernie := moetest.Spec{ModelType: "ernie4_5_moe", Hidden: 16, Experts: 4, TopK: 2, Inter: 8, NumLayers: 4, Layer: 3, FirstKDense: 1,
		SparseStep: 2, DType: "F32", Seed: 71}
	const ep = "model.layers.3.mlp."
	checkLoadErrors(t, ernie, []loadError{
		{"bias as a vector", func(m *moetest.Model) { find(m, ep+"moe_statics.e_score_correction_bias").Shape = []int{4} },
			`tensor "` + ep + `moe_statics.e_score_correction_bias" has shape [4], the config needs [1 4]`, moe.ErrMissingTensor},
		{"layer between the interval's", func(m *moetest.Model) { m.Config["moe_layer_interval"] = 3 },
			`layer 3 is a dense MLP layer (MoE layers are 1…3 with (n+1) % moe_layer_interval 3 = 0), not MoE`, moe.ErrDenseLayer},
		{"no moe_k", func(m *moetest.Model) { delete(m.Config, "moe_k") }, `ernie4_5_moe config.json is missing [num_experts_per_tok]`, nil},
		{"zero interval", func(m *moetest.Model) { m.Config["moe_layer_interval"] = 0 }, `moe_layer_interval 0 must be positive`, nil},
	})

	llama := moetest.Spec{ModelType: "llama4", Hidden: 16, Experts: 4, TopK: 1, Inter: 4, NumLayers: 2, Layer: 1, SparseStep: 2, DType: "BF16", Seed: 72}
	const lp = "language_model.model.layers.1.feed_forward."
	checkLoadErrors(t, llama, []loadError{
		{"gate_up in [out, in] form", func(m *moetest.Model) { find(m, lp+"experts.gate_up_proj").Shape = []int{4, 8, 16} },
			`tensor "` + lp + `experts.gate_up_proj" has shape [4 8 16], the config needs [4 16 8]`, moe.ErrShape},
		{"not in moe_layers", func(m *moetest.Model) { m.Config["text_config"].(map[string]any)["moe_layers"] = []int{0} },
			`layer 1 is a dense MLP layer (not in moe_layers [0]), not MoE`, moe.ErrDenseLayer},
		{"shared expert missing", func(m *moetest.Model) { drop(m, lp+"shared_expert.up_proj.weight") },
			`missing tensor "` + lp + `shared_expert.up_proj.weight"`, moe.ErrMissingTensor},
		{"no text_config", func(m *moetest.Model) { delete(m.Config, "text_config") }, `llama4 config.json has no text_config`, nil},
	})
	_, err = moe.ParseConfig([]byte(`{"model_type": "llama4_text", "hidden_size": 8, "num_experts_per_tok": 1, "num_local_experts": 2, "intermediate_size": 4, "interleave_moe_layer_step": 0}`))
	require.ErrorContains(t, err, "interleave_moe_layer_step 0 must be positive")
	c, err := arch.Parse([]byte(`{"model_type": "llama4_text", "hidden_size": 8, "num_experts_per_tok": 1, "num_local_experts": 2, "intermediate_size": 4, "num_hidden_layers": 4, "interleave_moe_layer_step": 2}`))
	require.NoError(t, err)
	require.Equal(t, "llama4", c.MoE.ModelType)
	require.ErrorIs(t, c.MoELayer(2), moe.ErrDenseLayer)
	require.NoError(t, c.MoELayer(3))
}
