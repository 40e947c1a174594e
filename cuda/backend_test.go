//go:build cudaemu && !cuda

package cuda_test

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// TestMoEOnEmulation: the launch code of the GPU MoE layer, run on the CPU
// emulation of the kernels, against the CPU layer (same bf16-rounded input;
// the device also rounds the intermediate activations to bf16).
func TestMoEOnEmulation(t *testing.T) {
	specs := []moetest.Spec{
		{ModelType: "deepseek_v2", Hidden: 64, Experts: 8, TopK: 3, Inter: 32, SharedExperts: 1, Method: "group_limited_greedy",
			Scoring: "softmax", NGroup: 4, TopKGroup: 2, Scaling: 16, DType: "BF16", Seed: 1},
		{ModelType: "deepseek_v3", Hidden: 48, Experts: 16, TopK: 4, Inter: 16, SharedExperts: 2, Method: "noaux_tc",
			Scoring: "sigmoid", NGroup: 4, TopKGroup: 2, NormTopK: true, Scaling: 2.5, DType: "BF16", Seed: 2},
		{ModelType: "qwen2_moe", Hidden: 32, Experts: 6, TopK: 2, Inter: 16, SharedInter: 32, NormTopK: true, DType: "F32", Seed: 3},
		{ModelType: "mixtral", Hidden: 32, Experts: 4, TopK: 2, Inter: 48, DType: "F32", Seed: 4},
	}
	for _, s := range specs {
		t.Run(s.ModelType, func(t *testing.T) {
			m, err := moetest.Generate(s)
			require.NoError(t, err)
			dir := filepath.Join(t.TempDir(), "ckpt")
			require.NoError(t, m.WriteTo(dir))
			l, err := moe.Load(dir, s.Layer)
			require.NoError(t, err)
			defer l.Close()
			checkMoE(t, cuda.NewEmu(), l, 1, 37)
		})
	}
}

// TestMLADecodeOnEmulation: MLA decode through the device launch code
// against dpattn.MLA.
func TestMLADecodeOnEmulation(t *testing.T) {
	in, want, wantLSE := mlaCase(t, 2, []int32{1, 16, 50}, 2, 64, 48, 16, 20, 0.2, kernels.F32)
	got, lse, err := cuda.MLADecode(cuda.NewEmu(), in)
	require.NoError(t, err)
	for i := range want {
		require.InDelta(t, want[i], got[i], 1e-5*(1+math.Abs(float64(want[i]))))
	}
	for i := range wantLSE {
		require.InDelta(t, wantLSE[i], lse[i], 1e-5*(1+math.Abs(float64(wantLSE[i]))))
	}
	_, _, err = cuda.MLADecode(cuda.NewEmu(), cuda.MLAInput{SeqLens: []int32{0}, Q: make([]float32, 4), D: 4, DV: 4, Heads: 1,
		BlockSize: 1, MaxBlocks: 1, BlockTable: []int32{0}, SplitRows: 1})
	require.ErrorContains(t, err, "sequence 0 has length 0")
}

func TestMoEBadShapes(t *testing.T) {
	cfg := &moe.Config{ModelType: "mixtral", Hidden: 24, NumExperts: 2, TopK: 1, Inter: 16, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	l, err := moe.NewRandom(cfg, kernels.BF16, 1)
	require.NoError(t, err)
	_, err = cuda.NewMoE(cuda.NewEmu(), l)
	require.ErrorContains(t, err, "must be multiples of 16")

	cfg.Hidden = 32
	l, err = moe.NewRandom(cfg, kernels.BF16, 1)
	require.NoError(t, err)
	g, err := cuda.NewMoE(cuda.NewEmu(), l)
	require.NoError(t, err)
	defer g.Close()
	require.ErrorContains(t, g.Forward(make([]float32, 33), make([]float32, 33)), "want [tokens, 32]")
}
