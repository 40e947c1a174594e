package moe_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/internal/stwrite"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// fp8Specs: every family as a fine-grained FP8 checkpoint, scales F32 (as
// DeepSeek ships them) and BF16 (as Qwen3.5 does), blocks of 128 (one
// partial block per matrix at these sizes) and blocks that do not divide
// the shapes.
func fp8Specs() []struct {
	name string
	spec moetest.Spec
} {
	return []struct {
		name string
		spec moetest.Spec
	}{
		{"mixtral fp8 128", moetest.Spec{ModelType: "mixtral", Hidden: 24, Experts: 8, TopK: 2, Inter: 20, DType: "F8_E4M3", Seed: 31}},
		{"qwen2_moe fp8 bf16 scales", moetest.Spec{ModelType: "qwen2_moe", Hidden: 40, Experts: 12, TopK: 4, Inter: 12, SharedInter: 28, NormTopK: true,
			DType: "F8_E4M3", FP8Block: [2]int{8, 16}, ScaleDType: "BF16", Seed: 32}},
		{"qwen3_moe fp8 odd blocks", moetest.Spec{ModelType: "qwen3_moe", Hidden: 32, Experts: 16, TopK: 4, Inter: 10, NormTopK: true,
			DType: "F8_E4M3", FP8Block: [2]int{3, 7}, Seed: 33}},
		{"deepseek_v2 fp8", moetest.Spec{ModelType: "deepseek_v2", Hidden: 48, Experts: 16, TopK: 3, Inter: 16, SharedExperts: 1, Method: "group_limited_greedy",
			Scoring: "softmax", NGroup: 4, TopKGroup: 2, Scaling: 16, DType: "F8_E4M3", FP8Block: [2]int{16, 16}, Seed: 34}},
		{"deepseek_v3 fp8 sharded", moetest.Spec{ModelType: "deepseek_v3", Hidden: 40, Experts: 16, TopK: 4, Inter: 20, SharedExperts: 2, Method: "noaux_tc",
			Scoring: "sigmoid", NGroup: 4, TopKGroup: 2, NormTopK: true, Scaling: 1.5, DType: "F8_E4M3", FP8Block: [2]int{16, 8}, Shards: 2, Seed: 35}},
	}
}

// TestFP8MatchesReference: FP8 checkpoints against the float64 reference on
// their dequantized weights: identical ids, y within 1e-5; the experts stay
// FP8 in memory.
func TestFP8MatchesReference(t *testing.T) {
	for _, tt := range fp8Specs() {
		t.Run(tt.name, func(t *testing.T) {
			m, dir := writeModel(t, tt.spec)
			l, err := moe.Load(dir, m.Spec.Layer)
			require.NoError(t, err)
			defer l.Close()
			require.Equal(t, kernels.F8E4M3, l.WeightDType())
			ex, ok := l.Expert(0)
			require.True(t, ok)
			br, bc := ex.Down.BlockSize()
			require.Equal(t, tt.spec.FP8Block[0]+128*btoi(tt.spec.FP8Block == [2]int{}), br)
			require.Equal(t, tt.spec.FP8Block[1]+128*btoi(tt.spec.FP8Block == [2]int{}), bc)
			for _, tokens := range []int{1, 7, 37} {
				checkAgainstReference(t, l, m, moetest.Input(uint64(tokens)+tt.spec.Seed*100, tokens, tt.spec.Hidden, false))
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestFP8LoadErrors: what is wrong with an FP8 checkpoint is an error
// naming the file, the tensor and the problem.
func TestFP8LoadErrors(t *testing.T) {
	spec := moetest.Spec{ModelType: "qwen3_moe", Hidden: 16, Experts: 4, TopK: 2, Inter: 8, DType: "F8_E4M3", FP8Block: [2]int{8, 8}, Seed: 40}
	const w = "model.layers.0.mlp.experts.1.up_proj.weight"
	tests := []struct {
		name string
		edit func(m *moetest.Model)
		err  string
		kind error
	}{
		{"scales missing", func(m *moetest.Model) { drop(m, w+"_scale_inv") },
			`fp8 tensor "` + w + `" has no scales "` + w + `_scale_inv"`, moe.ErrMissingTensor},
		{"scales misshapen", func(m *moetest.Model) {
			st := find(m, w+"_scale_inv")
			st.Shape = []int{2, 1}
			st.Data = st.Data[:8]
		}, `tensor "` + w + `_scale_inv" has shape [2 1], the config needs [1 2] (the scales of ` + w + ` in blocks of [8, 8])`, moe.ErrMissingTensor},
		{"scales of an integer dtype", func(m *moetest.Model) { find(m, w+"_scale_inv").DType = "I32" },
			`tensor "` + w + `_scale_inv" has dtype I32`, moe.ErrUnsupportedFormat},
		{"NaN scale", func(m *moetest.Model) { copy(find(m, w+"_scale_inv").Data[4:], []byte{0, 0, 0xC0, 0x7F}) },
			`tensor "` + w + `": kernels: fp8 scale [0, 1] is NaN`, moe.ErrUnsupportedFormat},
		{"NaN byte", func(m *moetest.Model) { find(m, w).Data[5*16+3] = 0x7F },
			`tensor "` + w + `": kernels: fp8 weight [5, 3] is the NaN byte 0x7f`, moe.ErrUnsupportedFormat},
		{"e5m2", func(m *moetest.Model) { find(m, w).DType = "F8_E5M2" },
			`tensor "` + w + `" is F8_E5M2: fp8 weights must be e4m3`, moe.ErrUnsupportedFormat},
		{"unknown quant_method", func(m *moetest.Model) {
			m.Config["quantization_config"] = map[string]any{"quant_method": "awq", "bits": 4}
		}, `quantization_config.quant_method "awq" is not supported (supported: fp8)`, moe.ErrUnsupportedFormat},
		{"no block size", func(m *moetest.Model) {
			m.Config["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3"}
		}, `quantization_config.weight_block_size is []: fp8 weights need a block size`, moe.ErrUnsupportedFormat},
		{"e5m2 format", func(m *moetest.Model) {
			m.Config["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": []int{8, 8}}
		}, `quantization_config.fmt "e5m2" is not supported`, moe.ErrUnsupportedFormat},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := moetest.Generate(spec)
			require.NoError(t, err)
			tt.edit(m)
			dir := t.TempDir()
			require.NoError(t, m.WriteTo(dir))
			_, err = moe.Load(dir, 0)
			require.ErrorContains(t, err, tt.err)
			require.ErrorIs(t, err, tt.kind)
		})
	}
}

func find(m *moetest.Model, name string) *stwrite.Tensor {
	for i := range m.Tensors {
		if m.Tensors[i].Name == name {
			return &m.Tensors[i]
		}
	}
	panic("no tensor " + name)
}

func drop(m *moetest.Model, name string) {
	for i := range m.Tensors {
		if m.Tensors[i].Name == name {
			m.Tensors = append(m.Tensors[:i], m.Tensors[i+1:]...)
			return
		}
	}
	panic("no tensor " + name)
}
