//go:build cuda || cudaemu

package moegpu_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
	"github.com/moex-project/moex/moe/moegpu"
)

// TestEpiloguesOnDevice runs the experts of every family whose
// experts compute more than SwiGLU on the device (moegpu.Experts, the
// router on the CPU): gpt_oss's biases and clamped SwiGLU, llama4's
// routing weight on the input, deepseek_v4's clamped SiLU (a limit that
// binds), gemma4's GeGLU experts and dense MLP; each within 1e-2 of the
// CPU layer, which the same weights with SwiGLU (or the weight on the
// output) are far from. Then the whole layer on the device pipeline
// (moegpu.MoE: gpt_oss's router bias, llama4's choice on the logits,
// deepseek_v4's sqrt-softplus scores), and gemma4's refused by name.
func TestEpiloguesOnDevice(t *testing.T) {
	oss := moe.GptOss20B()
	oss.Hidden, oss.Inter, oss.NumExperts, oss.TopK = 64, 64, 4, 2
	llama := &moe.Config{ModelType: "llama4", Hidden: 64, NumExperts: 4, TopK: 1, Inter: 32, SharedInter: 32, Scoring: moe.Sigmoid,
		Method: moe.Greedy, RoutedScaling: 1, ChooseOnLogits: true, WeightOnInput: true}
	v4 := moe.DeepSeekV4Flash()
	v4.Hidden, v4.Inter, v4.SharedInter, v4.NumExperts, v4.TopK = 64, 32, 32, 8, 2
	v4.Act.Limit = 0.2
	gemma := &moe.Config{ModelType: "gemma4", Hidden: 64, NumExperts: 6, TopK: 2, Inter: 32, SharedInter: 48, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1, ResidualInput: true, RMSNormEps: 1e-6,
		Act: kernels.Activation{Kind: kernels.GeGLU}, SharedAct: kernels.Activation{Kind: kernels.GeGLU}}
	for _, tc := range []struct {
		cfg   *moe.Config
		plain func(c *moe.Config) // the same layer without its epilogue
	}{
		{oss, func(c *moe.Config) { c.Act = kernels.Activation{} }},
		{llama, func(c *moe.Config) { c.WeightOnInput = false }},
		{v4, func(c *moe.Config) { c.Act = kernels.Activation{} }},
		{gemma, func(c *moe.Config) { c.Act, c.SharedAct = kernels.Activation{}, kernels.Activation{} }},
	} {
		t.Run(tc.cfg.ModelType, func(t *testing.T) {
			dev := testDevice(t)
			l, err := moe.NewRandom(tc.cfg, kernels.BF16, 3)
			require.NoError(t, err)
			pc := *tc.cfg
			tc.plain(&pc)
			plain, err := moe.NewRandom(&pc, kernels.BF16, 3)
			require.NoError(t, err)
			const T = 19
			x := moetest.Input(11, T, tc.cfg.Hidden, false)
			for i, v := range x {
				x[i] = 3 * half.BF16ToF32(half.F32ToBF16(v))
			}
			want, other := make([]float32, len(x)), make([]float32, len(x))
			require.NoError(t, l.Forward(context.Background(), x, want))
			require.NoError(t, plain.Forward(context.Background(), x, other))
			ref := make([]float64, len(want))
			for i, v := range want {
				ref[i] = float64(v)
			}
			require.Greater(t, moetest.RelErr(other, ref), 5e-2, "the epilogue must matter")

			ex, err := moegpu.NewExperts(dev, l)
			require.NoError(t, err)
			defer ex.Close()
			l.SetExpertRunner(ex)
			got := make([]float32, len(x))
			require.NoError(t, l.Forward(context.Background(), x, got))
			e := moetest.RelErr(got, ref)
			t.Logf("relative error %.2e", e)
			require.LessOrEqual(t, e, 1e-2)

			l.SetExpertRunner(nil)
			if tc.cfg.ResidualInput {
				_, err = moegpu.NewMoE(dev, l)
				require.ErrorIs(t, err, moe.ErrUnsupportedFormat)
				require.ErrorContains(t, err, "do not route on the device yet: run the router on the CPU (moegpu.Experts)")
				return
			}
			checkMoE(t, dev, l, 1, 19)
		})
	}
}

// TestGroupedFFNEpilogue: the device form of the grouped FFN contract on
// gpt_oss's groups (biases, clamped SwiGLU), and groups of two epilogues
// refused.
func TestGroupedFFNEpilogue(t *testing.T) {
	dev := testDevice(t)
	cfg := moe.GptOss20B()
	cfg.Hidden, cfg.Inter, cfg.NumExperts, cfg.TopK = 32, 32, 4, 2
	l, err := moe.NewRandom(cfg, kernels.BF16, 1)
	require.NoError(t, err)
	x := moetest.Input(2, 3, 32, false)
	for i, v := range x {
		x[i] = half.BF16ToF32(half.F32ToBF16(v))
	}
	ids := []int32{1, 2, 0, 3, 1, 3}
	w := []float32{0.5, 0.5, 0.25, 0.75, 0.6, 0.4}
	run := func(onDevice bool) [][]float32 {
		g, err := l.Group(ids, w, 2, false, nil)
		require.NoError(t, err)
		if onDevice {
			require.NoError(t, moegpu.GroupedFFN(context.Background(), dev, x, g.Groups))
		} else {
			require.NoError(t, l.RunExperts(context.Background(), x, g.Groups, nil))
		}
		var out [][]float32
		for _, gr := range g.Groups {
			out = append(out, gr.Out)
		}
		return out
	}
	want, got := run(false), run(true)
	for i := range want {
		ref := make([]float64, len(want[i]))
		for j, v := range want[i] {
			ref[j] = float64(v)
		}
		require.LessOrEqual(t, moetest.RelErr(got[i], ref), 1e-2, "group %d", i)
	}
	g, err := l.Group(ids, w, 2, false, nil)
	require.NoError(t, err)
	g.Groups[1].Act = kernels.Activation{}
	err = moegpu.GroupedFFN(context.Background(), dev, x, g.Groups)
	require.ErrorContains(t, err, "group 1's activation silu, input scaling false or biases differ from group 0's")
}
