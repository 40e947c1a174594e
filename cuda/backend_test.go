//go:build cudaemu && !cuda

package cuda_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
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
			g, err := cuda.NewMoE(cuda.NewEmu(), l)
			require.NoError(t, err)
			defer g.Close()
			for _, T := range []int{1, 37} {
				x := moetest.Input(uint64(T), T, s.Hidden, false)
				for i, v := range x {
					x[i] = half.BF16ToF32(half.F32ToBF16(v))
				}
				want := make([]float32, len(x))
				require.NoError(t, l.Forward(context.Background(), x, want))
				got := make([]float32, len(x))
				require.NoError(t, g.Forward(x, got))
				ref := make([]float64, len(want))
				for i, v := range want {
					ref[i] = float64(v)
				}
				e := moetest.RelErr(got, ref)
				t.Logf("%d tokens: relative error %.2e", T, e)
				require.LessOrEqual(t, e, 1e-2)
			}
		})
	}
}
