package moe_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/internal/stwrite"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/kerneltest"
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
	tests := []loadError{
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
		}, `quantization_config.quant_method "awq" is not supported (supported: fp8, compressed-tensors, mxfp4)`, moe.ErrUnsupportedFormat},
		{"no block size", func(m *moetest.Model) {
			m.Config["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3"}
		}, `quantization_config.weight_block_size is []: fp8 weights need a block size`, moe.ErrUnsupportedFormat},
		{"e5m2 format", func(m *moetest.Model) {
			m.Config["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": []int{8, 8}}
		}, `quantization_config.fmt "e5m2" is not supported`, moe.ErrUnsupportedFormat},
		{"a module listed unconverted stored fp8", func(m *moetest.Model) {
			m.Config["quantization_config"].(map[string]any)["modules_to_not_convert"] = []string{"lm_head", "experts.1.up_proj"}
		}, `tensor "` + w + `" is stored F8_E4M3 but quantization_config's modules_to_not_convert "experts.1.up_proj" leaves module "model.layers.0.mlp.experts.1.up_proj" unquantized`, moe.ErrUnsupportedFormat},
		{"a parent in ignored_layers", func(m *moetest.Model) {
			m.Config["quantization_config"].(map[string]any)["ignored_layers"] = []string{"model.layers.0.mlp.experts"}
		}, `quantization_config's ignored_layers "model.layers.0.mlp.experts" leaves module "model.layers.0.mlp.experts.0.gate_proj" unquantized`, moe.ErrUnsupportedFormat},
	}
	checkLoadErrors(t, spec, tests)
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

// TestINT4MatchesReference: compressed-tensors int4 checkpoints (Kimi's
// groups of 32, BF16 scales; groups of 16 with F32 scales) against the
// float64 reference on their values.
func TestINT4MatchesReference(t *testing.T) {
	for _, tt := range []struct {
		name string
		spec moetest.Spec
	}{
		{"deepseek_v3 int4 g32", moetest.Spec{ModelType: "deepseek_v3", Hidden: 64, Experts: 16, TopK: 4, Inter: 32, SharedExperts: 1, Method: "noaux_tc",
			Scoring: "sigmoid", NGroup: 4, TopKGroup: 2, NormTopK: true, Scaling: 2.5, DType: "INT4", Seed: 51}},
		{"qwen3_moe int4 g16 f32 scales", moetest.Spec{ModelType: "qwen3_moe", Hidden: 48, Experts: 8, TopK: 2, Inter: 32, NormTopK: true,
			DType: "INT4", GroupSize: 16, ScaleDType: "F32", Shards: 2, Seed: 52}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, dir := writeModel(t, tt.spec)
			l, err := moe.Load(dir, m.Spec.Layer)
			require.NoError(t, err)
			defer l.Close()
			require.Equal(t, kernels.INT4, l.WeightDType())
			for _, tokens := range []int{1, 7, 37} {
				checkAgainstReference(t, l, m, moetest.Input(uint64(tokens)+tt.spec.Seed*100, tokens, tt.spec.Hidden, false))
			}
		})
	}
}

// TestINT4LoadErrors: what is wrong with a compressed-tensors checkpoint
// is an error naming the tensor or the scheme.
func TestINT4LoadErrors(t *testing.T) {
	spec := moetest.Spec{ModelType: "qwen3_moe", Hidden: 32, Experts: 4, TopK: 2, Inter: 16, DType: "INT4", GroupSize: 16, Seed: 53}
	const w = "model.layers.0.mlp.experts.2.down_proj.weight"
	scheme := func(weights map[string]any, acts any) func(m *moetest.Model) {
		return func(m *moetest.Model) {
			m.Config["quantization_config"] = map[string]any{"quant_method": "compressed-tensors", "format": "pack-quantized",
				"config_groups": map[string]any{"group_0": map[string]any{"targets": []string{"Linear"}, "weights": weights, "input_activations": acts}}}
		}
	}
	int4 := map[string]any{"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 16}
	with := func(k string, v any) map[string]any {
		o := map[string]any{}
		for a, b := range int4 {
			o[a] = b
		}
		o[k] = v
		return o
	}
	tests := []loadError{
		{"scale missing", func(m *moetest.Model) { drop(m, w+"_scale") }, `missing tensor "` + w + `_scale" (the scales of int4 tensor ` + w + `)`, moe.ErrMissingTensor},
		{"scale misshapen", func(m *moetest.Model) {
			st := find(m, w+"_scale")
			st.Shape = []int{32, 2}
			st.Data = append(st.Data, st.Data...)
		}, `tensor "` + w + `_scale" has shape [32 2], the config needs [32 1]`, moe.ErrMissingTensor},
		{"packed bytes disagree", func(m *moetest.Model) {
			st := find(m, w+"_packed")
			st.Shape = []int{32, 1}
			st.Data = st.Data[:128]
		}, `tensor "` + w + `_packed" has shape [32 1], the config needs [32 2]`, moe.ErrMissingTensor},
		{"weight_shape disagrees", func(m *moetest.Model) { find(m, w+"_shape").Data[0] = 31 }, `tensor "` + w + `_shape" says the weight is [31 16], the config needs [32 16]`, moe.ErrMissingTensor},
		{"asymmetric", func(m *moetest.Model) {
			m.Tensors = append(m.Tensors, stwrite.Tensor{Name: w + "_zero_point", DType: "I32", Shape: []int{1}, Data: make([]byte, 4)})
		}, `has ` + w + `_zero_point: asymmetric int4 is not supported`, moe.ErrUnsupportedFormat},
		{"8 bits", scheme(with("num_bits", 8), nil), `weights scheme (num_bits 8, type "int", symmetric true, strategy "group", group_size 16) is not supported`, moe.ErrUnsupportedFormat},
		{"asymmetric scheme", scheme(with("symmetric", false), nil), `symmetric false`, moe.ErrUnsupportedFormat},
		{"channel strategy", scheme(with("strategy", "channel"), nil), `strategy "channel"`, moe.ErrUnsupportedFormat},
		{"activations quantized", scheme(int4, map[string]any{"num_bits": 8}), `quantizes input activations`, moe.ErrUnsupportedFormat},
		{"another format", func(m *moetest.Model) {
			m.Config["quantization_config"] = map[string]any{"quant_method": "compressed-tensors", "format": "float-quantized"}
		}, `compressed-tensors format "float-quantized" is not supported (supported: pack-quantized)`, moe.ErrUnsupportedFormat},
		{"an ignored module stored int4", func(m *moetest.Model) {
			m.Config["quantization_config"].(map[string]any)["ignore"] = []string{"lm_head", `re:.*experts\.2\.down`}
		}, `tensor "` + w + `" is stored int4 (` + w + `_packed) but quantization_config's ignore "re:.*experts\\.2\\.down" leaves module "model.layers.0.mlp.experts.2.down_proj" unquantized`, moe.ErrUnsupportedFormat},
		{"an ignore pattern that does not compile", func(m *moetest.Model) {
			m.Config["quantization_config"].(map[string]any)["ignore"] = []string{"re:(experts"}
		}, `quantization_config.ignore entry "re:(experts" is not a pattern moex reads`, moe.ErrUnsupportedFormat},
		{"packed without a config", func(m *moetest.Model) { delete(m.Config, "quantization_config") },
			`tensor "model.layers.0.mlp.experts.0.gate_proj.weight" is stored packed`, moe.ErrUnsupportedFormat},
	}
	checkLoadErrors(t, spec, tests)
}

// TestMXFP4Layer: a layer built in the test with MXFP4 experts (the format
// gpt-oss ships its experts in) against the float64 reference on their
// values, for several batch sizes; and the bits of a token do not depend
// on its batch.
func TestMXFP4Layer(t *testing.T) {
	const H, I, E, K = 64, 96, 6, 2
	rng := rand.New(rand.NewPCG(61, 62))
	cfg := &moe.Config{ModelType: "mixtral", Hidden: H, NumExperts: E, TopK: K, Inter: I, NormTopK: true, Scoring: moe.Softmax, Method: moe.Greedy, RoutedScaling: 1}
	ref := &moetest.Model{Spec: moetest.Spec{ModelType: "mixtral", Hidden: H, Experts: E, TopK: K, Inter: I}}
	var w moe.Weights
	w.Gate, ref.Gate = kerneltest.Weights(rng, kernels.BF16, E, H)
	for e := 0; e < E; e++ {
		var x moe.Expert
		var r moetest.Expert64
		x.Gate, r.Gate = kerneltest.MXFP4Weights(rng, I, H)
		x.Up, r.Up = kerneltest.MXFP4Weights(rng, I, H)
		x.Down, r.Down = kerneltest.MXFP4Weights(rng, H, I)
		w.Experts = append(w.Experts, x)
		ref.Experts = append(ref.Experts, r)
	}
	l, err := moe.New(cfg, w)
	require.NoError(t, err)
	require.Equal(t, kernels.MXFP4, l.WeightDType())
	var all []float32
	for _, tokens := range []int{1, 5, 33} {
		x := moetest.Input(uint64(tokens), tokens, H, false)
		checkAgainstReference(t, l, ref, x)
		all = x
	}
	y := make([]float32, len(all))
	require.NoError(t, l.Forward(context.Background(), all, y))
	one := make([]float32, H)
	require.NoError(t, l.Forward(context.Background(), all[7*H:8*H], one))
	require.Equal(t, y[7*H:8*H], one, "token 7 alone")
}

// loadError is a checkpoint edit and the error loading layer 0 must give
// (its class, where it has one).
type loadError struct {
	name string
	edit func(m *moetest.Model)
	err  string
	kind error
}

// checkLoadErrors writes spec's checkpoint once per case, edited, and
// checks the error of loading its layer 0: the message and the class.
func checkLoadErrors(t *testing.T, spec moetest.Spec, tests []loadError) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := moetest.Generate(spec)
			require.NoError(t, err)
			tt.edit(m)
			dir := t.TempDir()
			require.NoError(t, m.WriteTo(dir))
			_, err = moe.Load(dir, spec.Layer)
			require.ErrorContains(t, err, tt.err)
			if tt.kind != nil {
				require.ErrorIs(t, err, tt.kind)
			}
		})
	}
}
