package moe_test

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/moe"
)

// TestDeepseekV4Errors: bad tid2eid tables, configs and token ids are
// named errors.
func TestDeepseekV4Errors(t *testing.T) {
	spec := moetest.Spec{ModelType: "deepseek_v4", Hidden: 16, Experts: 8, TopK: 2, Inter: 8, SharedExperts: 1, NumLayers: 3, Layer: 0,
		HashLayers: 2, Vocab: 10, DType: "BF16", Seed: 80}
	const p = "model.layers.0.mlp."
	setEntry := func(i int, v uint64) func(m *moetest.Model) {
		return func(m *moetest.Model) { binary.LittleEndian.PutUint64(find(m, p+"gate.tid2eid").Data[8*i:], v) }
	}
	checkLoadErrors(t, spec, []loadError{
		{"expert out of range", setEntry(2, 8), "tid2eid row 1 names expert 8; the layer has 8 experts", moe.ErrShape},
		{"negative expert", setEntry(0, math.MaxUint64), "tid2eid row 0 names expert -1", moe.ErrShape},
		{"expert twice", func(m *moetest.Model) {
			d := find(m, p+"gate.tid2eid").Data
			copy(d[8:16], d[0:8])
		}, "tid2eid row 0 names expert", moe.ErrShape},
		{"table of another vocabulary", func(m *moetest.Model) { m.Config["vocab_size"] = 11 },
			`tensor "` + p + `gate.tid2eid" has shape [10 2], the config needs [11 2]`, moe.ErrMissingTensor},
		{"table missing", func(m *moetest.Model) { drop(m, p+"gate.tid2eid") }, `missing tensor "` + p + `gate.tid2eid"`, moe.ErrMissingTensor},
		{"table of floats", func(m *moetest.Model) { find(m, p+"gate.tid2eid").DType = "F64" }, `has dtype F64, want I32 or I64`, moe.ErrUnsupportedFormat},
		{"fused experts of another width", func(m *moetest.Model) { find(m, p+"experts.gate_up_proj").Shape = []int{8, 8, 32} },
			`tensor "` + p + `experts.gate_up_proj" has shape [8 8 32], the config needs [8 16 16]`, moe.ErrShape},
		{"unknown scoring", func(m *moetest.Model) { m.Config["scoring_func"] = "softsign" }, `unknown scoring_func "softsign" (want softmax, sigmoid or sqrtsoftplus)`, nil},
		{"bad layer type", func(m *moetest.Model) { m.Config["mlp_layer_types"] = []string{"hash_moe", "dense", "moe"} },
			`mlp_layer_types[1] is "dense" (want hash_moe or moe)`, nil},
		{"layer types of another depth", func(m *moetest.Model) { m.Config["mlp_layer_types"] = []string{"hash_moe", "moe"} },
			`mlp_layer_types has 2 entries, num_hidden_layers is 3`, nil},
		{"no clamp", func(m *moetest.Model) { m.Config["swiglu_limit"] = 0 }, `clamped SiLU needs a positive finite limit`, nil},
	})
	// A score layer needs its correction bias.
	score := spec
	score.Layer = 2
	checkLoadErrors(t, score, []loadError{
		{"bias missing", func(m *moetest.Model) { drop(m, "model.layers.2.mlp.gate.e_score_correction_bias") },
			`missing tensor "model.layers.2.mlp.gate.e_score_correction_bias"`, moe.ErrMissingTensor},
	})

	m, dir := writeModel(t, spec)
	l, err := moe.Load(dir, 0)
	require.NoError(t, err)
	defer l.Close()
	require.True(t, l.TokenRouted())
	x := moetest.Input(1, 3, spec.Hidden, false)
	y := make([]float32, len(x))
	ctx := context.Background()
	err = l.Forward(ctx, x, y)
	require.ErrorIs(t, err, moe.ErrShape)
	require.ErrorContains(t, err, "chooses its experts by token id (a hash layer): its forward pass needs the batch's token ids")
	err = l.ForwardTokens(ctx, x, []int32{1, 10, 2}, y, nil, nil)
	require.ErrorIs(t, err, moe.ErrShape)
	require.ErrorContains(t, err, "token 1 has id 10, outside the hash layer's tid2eid table of vocab_size 10 rows")
	require.ErrorContains(t, l.ForwardTokens(ctx, x, []int32{-1, 0, 0}, y, nil, nil), "token 0 has id -1")
	require.ErrorContains(t, l.ForwardTokens(ctx, x, []int32{1, 2}, y, nil, nil), "2 token ids for 3 tokens")
	require.ErrorContains(t, l.Route(ctx, x, make([]int32, 6), make([]float32, 6)), "needs the batch's token ids")
	// The good ids still run, and the layer still serves after the errors.
	ids := make([]int32, 6)
	require.NoError(t, l.ForwardTokens(ctx, x, []int32{1, 9, 0}, y, ids, nil))
	for tok, id := range []int{1, 9, 0} {
		want := append([]int(nil), m.TokenExperts[id]...)
		if want[0] > want[1] {
			want[0], want[1] = want[1], want[0]
		}
		require.Equal(t, []int32{int32(want[0]), int32(want[1])}, ids[2*tok:2*tok+2])
	}
	// A score layer ignores token ids.
	_, sdir := writeModel(t, score)
	ls, err := moe.Load(sdir, 2)
	require.NoError(t, err)
	defer ls.Close()
	require.False(t, ls.TokenRouted())
	require.NoError(t, ls.Forward(ctx, x, y))
}

// TestGemma4Errors: configs without a MoE block or with an activation moex
// does not compute, and missing or bad norms, are named errors.
func TestGemma4Errors(t *testing.T) {
	spec := moetest.Spec{ModelType: "gemma4", Hidden: 16, Experts: 4, TopK: 2, Inter: 8, DenseInter: 12, DType: "BF16", Seed: 81}
	const p = "model.language_model.layers.0."
	text := func(m *moetest.Model) map[string]any { return m.Config["text_config"].(map[string]any) }
	checkLoadErrors(t, spec, []loadError{
		{"dense model", func(m *moetest.Model) { text(m)["enable_moe_block"] = false },
			"gemma4 config.json has no MoE block (enable_moe_block is false): the dense Gemma 4 models are not MoE", moe.ErrDenseLayer},
		{"no enable_moe_block", func(m *moetest.Model) { delete(text(m), "enable_moe_block") }, "(enable_moe_block is missing)", moe.ErrDenseLayer},
		{"exact gelu", func(m *moetest.Model) { text(m)["hidden_activation"] = "gelu" },
			`gemma4 hidden_activation "gelu" is not supported (supported: gelu_pytorch_tanh, gelu_new, gelu_fast)`, moe.ErrUnsupportedFormat},
		{"no text_config", func(m *moetest.Model) { delete(m.Config, "text_config") }, "gemma4 config.json has no text_config", nil},
		{"no top_k_experts", func(m *moetest.Model) { delete(text(m), "top_k_experts") }, "gemma4 config.json is missing [top_k_experts]", nil},
		{"norm missing", func(m *moetest.Model) { drop(m, p+"post_feedforward_layernorm_2.weight") },
			`missing tensor "` + p + `post_feedforward_layernorm_2.weight"`, moe.ErrMissingTensor},
		{"norm not finite", func(m *moetest.Model) {
			d := find(m, p+"pre_feedforward_layernorm.weight").Data
			binary.LittleEndian.PutUint16(d[4:], 0x7fc0) // a bf16 NaN
		}, `tensor "` + p + `pre_feedforward_layernorm.weight"`, moe.ErrNonFinite},
		{"per-expert scale of another size", func(m *moetest.Model) {
			s := find(m, p+"router.per_expert_scale")
			s.Shape, s.Data = []int{3}, s.Data[:6]
		}, `tensor "` + p + `router.per_expert_scale" has shape [3], the config needs [4]`, moe.ErrMissingTensor},
		{"dense MLP of another width", func(m *moetest.Model) { text(m)["intermediate_size"] = 10 },
			`tensor "` + p + `mlp.gate_proj.weight" has shape [12 16], the config needs [10 16]`, moe.ErrMissingTensor},
	})
}

// TestStep3Errors: step3's layer list, stacked tensors and sizes.
func TestStep3Errors(t *testing.T) {
	spec := moetest.Spec{ModelType: "step3_text", Hidden: 16, Experts: 4, TopK: 2, Inter: 8, SharedInter: 8, NumLayers: 3, Layer: 2,
		FirstKDense: 1, DType: "BF16", Seed: 82}
	const p = "model.layers.2."
	text := func(m *moetest.Model) map[string]any { return m.Config["text_config"].(map[string]any) }
	checkLoadErrors(t, spec, []loadError{
		{"not listed", func(m *moetest.Model) { text(m)["moe_layers_enum"] = "1" }, "layer 2 is a dense MLP layer (not in moe_layers_enum), not MoE", moe.ErrDenseLayer},
		{"listed as a list", func(m *moetest.Model) { text(m)["moe_layers_enum"] = []int{0, 1} }, "layer 2 is a dense MLP layer", moe.ErrDenseLayer},
		{"bad list", func(m *moetest.Model) { text(m)["moe_layers_enum"] = "1,two" }, `moe_layers_enum "1,two": "two" is not a layer index`, nil},
		{"no share_expert_dim", func(m *moetest.Model) { delete(text(m), "share_expert_dim") }, "step3_text config.json is missing [share_expert_dim]", nil},
		{"no moe_top_k", func(m *moetest.Model) { delete(text(m), "moe_top_k") }, "missing [moe_top_k]", nil},
		{"stack of another width", func(m *moetest.Model) { find(m, p+"moe.up_proj.weight").Shape = []int{4, 16, 8} },
			`tensor "` + p + `moe.up_proj.weight" has shape [4 16 8], the config needs [4 8 16]`, moe.ErrShape},
		{"stacks of two dtypes", func(m *moetest.Model) {
			d := find(m, p+"moe.down_proj.weight")
			d.DType = "F16"
		}, `moe.down_proj.weight`, moe.ErrUnsupportedFormat},
		{"shared expert missing", func(m *moetest.Model) { drop(m, p+"share_expert.down_proj.weight") },
			`missing tensor "` + p + `share_expert.down_proj.weight"`, moe.ErrMissingTensor},
	})
}

// TestPerExpertLayouts: families whose Hugging Face form fuses the experts
// (qwen3_5_moe, qwen3_vl_moe, deepseek_v4) load checkpoints that store them
// expert by expert, in every weight format (FP8 and INT4 releases are made
// Linear by Linear), within 1e-5 of the float64 reference with the same
// experts; a checkpoint with neither form names the fused tensor.
func TestPerExpertLayouts(t *testing.T) {
	for _, mt := range []string{"qwen3_5_moe", "qwen3_vl_moe", "deepseek_v4"} {
		for _, dt := range []string{"BF16", "F8_E4M3", "INT4"} {
			t.Run(mt+"/"+dt, func(t *testing.T) {
				spec := moetest.Spec{ModelType: mt, Hidden: 64, Experts: 6, TopK: 2, Inter: 32, NormTopK: true, DType: dt,
					PerExpert: true, FP8Block: [2]int{16, 32}, Seed: 91}
				switch mt {
				case "qwen3_5_moe":
					spec.SharedInter = 32
				case "deepseek_v4":
					spec.SharedExperts, spec.Scaling, spec.NumLayers, spec.Layer, spec.HashLayers, spec.Vocab = 1, 1.5, 2, 1, 1, 16
				}
				m, err := moetest.Generate(spec)
				require.NoError(t, err)
				dir := t.TempDir()
				require.NoError(t, m.WriteTo(dir))
				l, err := moe.Load(dir, spec.Layer)
				require.NoError(t, err)
				defer l.Close()
				x := moetest.Input(5, 7, spec.Hidden, false)
				want := m.Forward(x)
				y := make([]float32, len(x))
				ids := make([]int32, 7*spec.TopK)
				require.NoError(t, l.ForwardRouting(context.Background(), x, y, ids, make([]float32, len(ids))))
				require.Equal(t, want.IDs, ids)
				require.Less(t, moetest.RelErr(y, want.Y), 1e-5)
			})
		}
	}
	spec := moetest.Spec{ModelType: "qwen3_5_moe", Hidden: 16, Experts: 4, TopK: 2, Inter: 8, DType: "BF16", PerExpert: true, Seed: 92}
	const p = "model.language_model.layers.0.mlp.experts."
	checkLoadErrors(t, spec, []loadError{
		{"neither form", func(m *moetest.Model) { drop(m, p+"0.gate_proj.weight") },
			`missing tensor "` + p + `gate_up_proj"`, moe.ErrMissingTensor},
	})
}
