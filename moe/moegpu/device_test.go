//go:build cuda

package moegpu_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda/cudatest"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/kerneltest"
	"github.com/moex-project/moex/moe"
	"github.com/moex-project/moex/moe/moegpu"
)

// TestMoEOnGPU: the device MoE layer against the CPU layer (bf16-rounded
// input), as the emulation test checks it.
func TestMoEOnGPU(t *testing.T) {
	d := cudatest.Open(t)
	l, err := moe.NewRandom(moe.DeepSeekV2Lite(), kernels.BF16, 7)
	require.NoError(t, err)
	checkMoE(t, d, l, 1, 16, 300)
}

// TestGroupedFFNOnGPU runs the grouped FFN conformance suite on the GPU.
func TestGroupedFFNOnGPU(t *testing.T) {
	d := cudatest.Open(t)
	kerneltest.TestGroupedFFN(t, func(x []float32, groups []kernels.FFNGroup) error {
		return moegpu.GroupedFFN(context.Background(), d, x, groups)
	}, kerneltest.GroupedOptions{DTypes: []kernels.DType{kernels.BF16}, BF16Activations: true})
}

// TestExpertsOnGPU: a DeepSeek-V2-Lite-shaped layer with its experts
// resident on the GPU, against the CPU layer (bf16-rounded input).
func TestExpertsOnGPU(t *testing.T) {
	d := cudatest.Open(t)
	l, err := moe.NewRandom(moe.DeepSeekV2Lite(), kernels.BF16, 8)
	require.NoError(t, err)
	ex, err := moegpu.NewExperts(d, l)
	require.NoError(t, err)
	defer ex.Close()
	for _, T := range []int{1, 16, 300} {
		x := moetest.Input(uint64(T), T, l.Config.Hidden, false)
		for i, v := range x {
			x[i] = half.BF16ToF32(half.F32ToBF16(v))
		}
		want := make([]float32, len(x))
		l.SetExpertRunner(nil)
		require.NoError(t, l.Forward(context.Background(), x, want))
		got := make([]float32, len(x))
		l.SetExpertRunner(ex)
		require.NoError(t, l.Forward(context.Background(), x, got))
		ref := make([]float64, len(want))
		for i, v := range want {
			ref[i] = float64(v)
		}
		e := moetest.RelErr(got, ref)
		t.Logf("%d tokens: relative error %.2e", T, e)
		require.LessOrEqual(t, e, 1e-2)
	}
}

// TestMoEStepGraphOnGPU: the decode step as a CUDA graph on the GPU gives
// MoE.Forward's bits for batches within its bucket; logs eager and replay
// times.
func TestMoEStepGraphOnGPU(t *testing.T) {
	d := cudatest.Open(t)
	l, err := moe.NewRandom(moe.DeepSeekV2Lite(), kernels.BF16, 9)
	require.NoError(t, err)
	g, err := moegpu.NewMoE(d, l)
	require.NoError(t, err)
	defer g.Close()
	const bucket = 16
	step, err := g.NewStep(bucket)
	require.NoError(t, err)
	defer step.Close()
	H := l.Config.Hidden
	run := func(label string, tokens int) {
		x := moetest.Input(uint64(tokens), tokens, H, false)
		want := make([]float32, len(x))
		require.NoError(t, g.Forward(context.Background(), x, want))
		got := make([]float32, len(x))
		start := time.Now()
		const reps = 20
		for i := 0; i < reps; i++ {
			require.NoError(t, step.Forward(context.Background(), x, got))
		}
		t.Logf("%s, %d tokens: %v per step (copies included)", label, tokens, time.Since(start)/reps)
		require.Equal(t, want, got)
	}
	for _, n := range []int{bucket, 7, 1} {
		run("eager", n)
	}
	require.NoError(t, step.Capture())
	for _, n := range []int{bucket, 7, 1} {
		run("graph", n)
	}
}
