package moe_test

import (
	"context"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/internal/npy"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

var update = flag.Bool("update", false, "regenerate testdata/moe from the float64 reference")

// GoldenSpecs are the cases under testdata/moe: one folder per case with the
// checkpoint, x.npy and the reference's y.npy, ids.npy and w.npy.
var goldenSpecs = map[string]moetest.Spec{
	"mixtral_f32":               {ModelType: "mixtral", Hidden: 32, Experts: 8, TopK: 2, Inter: 16, NumLayers: 2, Layer: 1, DType: "F32", Seed: 101},
	"mixtral_bf16_sharded":      {ModelType: "mixtral", Hidden: 24, Experts: 6, TopK: 3, Inter: 20, DType: "BF16", Shards: 2, Seed: 102},
	"qwen2_moe_bf16":            {ModelType: "qwen2_moe", Hidden: 32, Experts: 10, TopK: 4, Inter: 12, SharedInter: 24, NormTopK: false, DType: "BF16", Seed: 103},
	"qwen2_moe_f16_norm":        {ModelType: "qwen2_moe", Hidden: 24, Experts: 6, TopK: 2, Inter: 16, SharedInter: 16, NormTopK: true, DType: "F16", Seed: 104},
	"qwen3_moe_f32":             {ModelType: "qwen3_moe", Hidden: 32, Experts: 12, TopK: 4, Inter: 12, NormTopK: true, NumLayers: 3, Layer: 2, DType: "F32", Seed: 105},
	"qwen3_moe_bf16_top1":       {ModelType: "qwen3_moe", Hidden: 24, Experts: 8, TopK: 1, Inter: 16, NormTopK: true, DType: "BF16", Seed: 106},
	"deepseek_v2_f32":           {ModelType: "deepseek_v2", Hidden: 32, Experts: 8, TopK: 3, Inter: 12, SharedExperts: 2, Method: "greedy", Scoring: "softmax", NGroup: 1, TopKGroup: 1, NumLayers: 2, Layer: 1, FirstKDense: 1, DType: "F32", Seed: 107},
	"deepseek_v2_bf16_glg":      {ModelType: "deepseek_v2", Hidden: 32, Experts: 16, TopK: 4, Inter: 8, SharedExperts: 1, Method: "group_limited_greedy", Scoring: "softmax", NGroup: 4, TopKGroup: 2, Scaling: 16, DType: "BF16", Seed: 108},
	"deepseek_v3_f32":           {ModelType: "deepseek_v3", Hidden: 32, Experts: 16, TopK: 4, Inter: 8, SharedExperts: 1, Method: "noaux_tc", Scoring: "sigmoid", NGroup: 4, TopKGroup: 2, NormTopK: true, Scaling: 2.5, DType: "F32", Seed: 109},
	"deepseek_v3_fp8":           {ModelType: "deepseek_v3", Hidden: 64, Experts: 16, TopK: 4, Inter: 32, SharedExperts: 1, Method: "noaux_tc", Scoring: "sigmoid", NGroup: 4, TopKGroup: 2, NormTopK: true, Scaling: 2.5, DType: "F8_E4M3", FP8Block: [2]int{16, 32}, Seed: 111},
	"qwen3_moe_fp8_bf16":        {ModelType: "qwen3_moe", Hidden: 48, Experts: 8, TopK: 2, Inter: 24, NormTopK: true, DType: "F8_E4M3", ScaleDType: "BF16", Seed: 112},
	"deepseek_v3_int4":          {ModelType: "deepseek_v3", Hidden: 64, Experts: 8, TopK: 2, Inter: 32, SharedExperts: 1, Method: "noaux_tc", Scoring: "sigmoid", NGroup: 2, TopKGroup: 1, NormTopK: true, Scaling: 2.5, DType: "INT4", Seed: 113},
	"gpt_oss_mxfp4":             {ModelType: "gpt_oss", Hidden: 64, Experts: 8, TopK: 4, Inter: 32, NumLayers: 2, Layer: 1, DType: "MXFP4", Seed: 114},
	"gpt_oss_bf16_sharded":      {ModelType: "gpt_oss", Hidden: 32, Experts: 6, TopK: 2, Inter: 24, DType: "BF16", Shards: 2, Seed: 115},
	"gpt_oss_f32_limit5":        {ModelType: "gpt_oss", Hidden: 24, Experts: 5, TopK: 1, Inter: 16, DType: "F32", SwigluLimit: 5, Seed: 116, Extra: map[string]any{"num_experts_per_tok": nil}},
	"qwen3_5_moe_bf16":          {ModelType: "qwen3_5_moe", Hidden: 32, Experts: 10, TopK: 4, Inter: 16, SharedInter: 24, NumLayers: 2, Layer: 1, DType: "BF16", Shards: 2, Seed: 117},
	"qwen3_5_moe_f32_top1":      {ModelType: "qwen3_5_moe", Hidden: 24, Experts: 6, TopK: 1, Inter: 12, SharedInter: 8, DType: "F32", Seed: 118},
	"qwen3_next_bf16":           {ModelType: "qwen3_next", Hidden: 32, Experts: 12, TopK: 5, Inter: 8, SharedInter: 16, NormTopK: true, DType: "BF16", Seed: 119, Extra: map[string]any{"norm_topk_prob": nil}},
	"qwen3_next_f16_raw":        {ModelType: "qwen3_next", Hidden: 24, Experts: 8, TopK: 2, Inter: 16, SharedInter: 16, NormTopK: false, DType: "F16", Seed: 120},
	"olmoe_bf16":                {ModelType: "olmoe", Hidden: 32, Experts: 8, TopK: 2, Inter: 16, DType: "BF16", Seed: 121},
	"olmoe_f32_norm":            {ModelType: "olmoe", Hidden: 24, Experts: 6, TopK: 3, Inter: 12, NormTopK: true, NumLayers: 2, Layer: 1, DType: "F32", Seed: 122},
	"minimax_m2_bf16":           {ModelType: "minimax_m2", Hidden: 32, Experts: 12, TopK: 4, Inter: 16, DType: "BF16", Seed: 123},
	"minimax_m2_fp8":            {ModelType: "minimax_m2", Hidden: 64, Experts: 8, TopK: 2, Inter: 32, DType: "F8_E4M3", FP8Block: [2]int{32, 32}, Seed: 124},
	"glm4_moe_bf16":             {ModelType: "glm4_moe", Hidden: 32, Experts: 16, TopK: 4, Inter: 8, SharedExperts: 1, NGroup: 1, TopKGroup: 1, NormTopK: true, Scaling: 2.5, NumLayers: 3, Layer: 2, FirstKDense: 1, DType: "BF16", Seed: 125},
	"glm4_moe_f32_groups":       {ModelType: "glm4_moe", Hidden: 24, Experts: 8, TopK: 2, Inter: 12, NGroup: 2, TopKGroup: 1, DType: "F32", Seed: 126},
	"dots1_bf16":                {ModelType: "dots1", Hidden: 32, Experts: 8, TopK: 3, Inter: 8, SharedExperts: 2, NGroup: 1, TopKGroup: 1, NormTopK: true, Scaling: 2, DType: "BF16", Seed: 127},
	"dots1_f32_groups":          {ModelType: "dots1", Hidden: 24, Experts: 8, TopK: 2, Inter: 12, SharedExperts: 1, NGroup: 2, TopKGroup: 1, NormTopK: false, Scaling: 2.5, NumLayers: 3, Layer: 2, FirstKDense: 1, DType: "F32", Seed: 140},
	"ernie4_5_moe_bf16":         {ModelType: "ernie4_5_moe", Hidden: 32, Experts: 8, TopK: 3, Inter: 16, SharedExperts: 2, NumLayers: 3, Layer: 1, FirstKDense: 1, DType: "BF16", Seed: 128},
	"ernie4_5_moe_f32_interval": {ModelType: "ernie4_5_moe", Hidden: 24, Experts: 6, TopK: 2, Inter: 12, NumLayers: 4, Layer: 3, FirstKDense: 1, SparseStep: 2, DType: "F32", Seed: 129},
	"qwen3_vl_moe_bf16":         {ModelType: "qwen3_vl_moe", Hidden: 32, Experts: 8, TopK: 2, Inter: 16, NormTopK: true, DType: "BF16", Seed: 130},
	"qwen3_vl_moe_f32_step2":    {ModelType: "qwen3_vl_moe", Hidden: 24, Experts: 6, TopK: 3, Inter: 8, NormTopK: false, NumLayers: 2, Layer: 1, SparseStep: 2, DType: "F32", Seed: 131},
	"llama4_bf16":               {ModelType: "llama4", Hidden: 32, Experts: 8, TopK: 1, Inter: 16, NumLayers: 2, Layer: 1, SparseStep: 2, DType: "BF16", Seed: 132},
	"llama4_f32_top2":           {ModelType: "llama4", Hidden: 24, Experts: 6, TopK: 2, Inter: 12, DType: "F32", Seed: 133},
	"deepseek_v4_bf16_hash":     {ModelType: "deepseek_v4", Hidden: 32, Experts: 16, TopK: 4, Inter: 16, SharedExperts: 1, Scaling: 1.5, NumLayers: 4, Layer: 1, HashLayers: 3, Vocab: 40, DType: "BF16", Seed: 134},
	"deepseek_v4_f32_clamp":     {ModelType: "deepseek_v4", Hidden: 24, Experts: 8, TopK: 2, Inter: 12, SharedExperts: 1, Scaling: 2.5, NumLayers: 3, Layer: 2, HashLayers: 2, Vocab: 30, LayerTypes: true, SwigluLimit: 0.25, DType: "F32", Seed: 135},
	"gemma4_bf16":               {ModelType: "gemma4", Hidden: 32, Experts: 8, TopK: 2, Inter: 16, DenseInter: 24, NumLayers: 2, Layer: 1, DType: "BF16", Seed: 136},
	"gemma4_f32_text_wide":      {ModelType: "gemma4", Hidden: 24, Experts: 6, TopK: 3, Inter: 12, DenseInter: 10, NumLayers: 3, Layer: 2, KVShared: 1, DoubleWide: true, TextOnly: true, DType: "F32", Seed: 137},
	"step3_bf16":                {ModelType: "step3_text", Hidden: 32, Experts: 8, TopK: 3, Inter: 16, SharedInter: 24, NormTopK: false, NumLayers: 3, Layer: 2, FirstKDense: 1, DType: "BF16", Seed: 138},
	"step3_f16_text_norm":       {ModelType: "step3_text", Hidden: 24, Experts: 6, TopK: 2, Inter: 12, SharedInter: 12, NormTopK: true, NumLayers: 2, Layer: 1, TextOnly: true, DType: "F16", Seed: 139, Extra: map[string]any{"moe_layers_enum": nil}},
	"deepseek_v3_bf16_all":      {ModelType: "deepseek_v3", Hidden: 24, Experts: 8, TopK: 8, Inter: 12, SharedExperts: 1, Method: "noaux_tc", Scoring: "sigmoid", NGroup: 2, TopKGroup: 2, NormTopK: true, Scaling: 2.5, DType: "BF16", Seed: 110},
}

const goldenTokens = 16

func goldenDir() string { return filepath.Join("..", "testdata", "moe") }

// TestGoldenGenerate writes testdata/moe when run with -update:
//
//	go test ./moe -run TestGoldenGenerate -update
func TestGoldenGenerate(t *testing.T) {
	if !*update {
		t.Skip("run with -update to regenerate testdata/moe")
	}
	require.NoError(t, os.RemoveAll(goldenDir()))
	for name, spec := range goldenSpecs {
		m, err := moetest.Generate(spec)
		require.NoError(t, err)
		dir := filepath.Join(goldenDir(), name)
		require.NoError(t, m.WriteTo(dir))
		x := moetest.Input(spec.Seed, goldenTokens, spec.Hidden, false)
		var tokens []int32
		if spec.Hash() {
			tokens = moetest.Tokens(spec.Seed, goldenTokens, spec.Vocab)
			require.NoError(t, npy.WriteInt32(filepath.Join(dir, "tokens.npy"), []int{goldenTokens}, tokens))
		}
		ref := m.ForwardTokens(x, tokens)
		y := make([]float32, len(ref.Y))
		for i, v := range ref.Y {
			y[i] = float32(v)
		}
		w := make([]float32, len(ref.Weights))
		for i, v := range ref.Weights {
			w[i] = float32(v)
		}
		require.NoError(t, npy.WriteFloat32(filepath.Join(dir, "x.npy"), []int{goldenTokens, spec.Hidden}, x))
		require.NoError(t, npy.WriteFloat32(filepath.Join(dir, "y.npy"), []int{goldenTokens, spec.Hidden}, y))
		require.NoError(t, npy.WriteInt32(filepath.Join(dir, "ids.npy"), []int{goldenTokens, spec.TopK}, ref.IDs))
		require.NoError(t, npy.WriteFloat32(filepath.Join(dir, "w.npy"), []int{goldenTokens, spec.TopK}, w))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "layer"), []byte{byte('0' + spec.Layer)}, 0o644))
	}
}

// TestGolden runs every stored case on every kernel implementation and
// compares with the stored reference.
func TestGolden(t *testing.T) {
	for _, impl := range kernels.Implementations() {
		t.Run(impl, func(t *testing.T) {
			restore, err := kernels.Use(impl)
			require.NoError(t, err)
			defer restore()
			testGolden(t)
		})
	}
}

// readGolden reads a stored case's input, the reference's output and
// experts, and its token ids (nil where the case has none).
func readGolden(t *testing.T, dir string) (x, y npy.Float32, ids npy.Int32, tokens []int32) {
	x, err := npy.ReadFloat32(filepath.Join(dir, "x.npy"))
	require.NoError(t, err)
	y, err = npy.ReadFloat32(filepath.Join(dir, "y.npy"))
	require.NoError(t, err)
	ids, err = npy.ReadInt32(filepath.Join(dir, "ids.npy"))
	require.NoError(t, err)
	if tok, err := npy.ReadInt32(filepath.Join(dir, "tokens.npy")); err == nil {
		tokens = tok.Data
	} else {
		require.ErrorIs(t, err, os.ErrNotExist)
	}
	return x, y, ids, tokens
}

func testGolden(t *testing.T) {
	entries, err := os.ReadDir(goldenDir())
	require.NoError(t, err)
	require.Len(t, entries, len(goldenSpecs), "testdata/moe is out of date: regenerate with -update")
	for _, e := range entries {
		t.Run(e.Name(), func(t *testing.T) {
			dir := filepath.Join(goldenDir(), e.Name())
			layer, err := os.ReadFile(filepath.Join(dir, "layer"))
			require.NoError(t, err)
			l, err := moe.Load(dir, int(layer[0]-'0'))
			require.NoError(t, err)
			defer l.Close()
			x, want, wantIDs, tokens := readGolden(t, dir)
			wantW, err := npy.ReadFloat32(filepath.Join(dir, "w.npy"))
			require.NoError(t, err)
			y := make([]float32, len(x.Data))
			ids := make([]int32, len(wantIDs.Data))
			w := make([]float32, len(wantW.Data))
			require.NoError(t, l.ForwardTokens(context.Background(), x.Data, tokens, y, ids, w))
			require.Equal(t, wantIDs.Data, ids)
			for i := range w {
				require.InDelta(t, wantW.Data[i], w[i], 1e-6*math.Max(1, math.Abs(float64(wantW.Data[i]))))
			}
			ref := make([]float64, len(want.Data))
			for i, v := range want.Data {
				ref[i] = float64(v)
			}
			require.LessOrEqual(t, moetest.RelErr(y, ref), 1e-5)
		})
	}
}

// TestGoldenBF16Dot: every stored bf16 case in the bf16-dot mode (asked
// for; never taken otherwise: the other cases' experts refuse it by name)
// chooses the reference's experts, stays within 1 % of its output (the
// error of rounding the activations to bf16; logged per case), and gives
// a token's bits alone as in the batch.
func TestGoldenBF16Dot(t *testing.T) {
	entries, err := os.ReadDir(goldenDir())
	require.NoError(t, err)
	for _, e := range entries {
		spec, ok := goldenSpecs[e.Name()]
		require.True(t, ok, e.Name())
		t.Run(e.Name(), func(t *testing.T) {
			dir := filepath.Join(goldenDir(), e.Name())
			l, err := moe.Load(dir, spec.Layer)
			require.NoError(t, err)
			defer l.Close()
			err = l.SetNumerics(kernels.BF16Dot)
			if spec.DType != "BF16" {
				require.ErrorIs(t, err, moe.ErrUnsupportedFormat)
				require.ErrorContains(t, err, "bf16dot numerics need BF16 weights")
				require.Equal(t, kernels.Exact, l.Numerics())
				return
			}
			require.NoError(t, err)
			x, want, wantIDs, tokens := readGolden(t, dir)
			y := make([]float32, len(x.Data))
			ids := make([]int32, len(wantIDs.Data))
			require.NoError(t, l.ForwardTokens(context.Background(), x.Data, tokens, y, ids, nil))
			require.Equal(t, wantIDs.Data, ids)
			ref := make([]float64, len(want.Data))
			for i, v := range want.Data {
				ref[i] = float64(v)
			}
			e := moetest.RelErr(y, ref)
			t.Logf("%s: bf16dot relative error %.2g", spec.ModelType, e)
			require.Greater(t, e, 0.0, "the mode was not taken")
			require.LessOrEqual(t, e, 1e-2)
			H := spec.Hidden
			var tok []int32
			if tokens != nil {
				tok = tokens[5:6]
			}
			one := make([]float32, H)
			require.NoError(t, l.ForwardTokens(context.Background(), x.Data[5*H:6*H], tok, one, nil, nil))
			require.Equal(t, y[5*H:6*H], one, "token 5 alone")
		})
	}
}
