//go:build cuda || cudaemu

package cuda_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/moe"
)

// checkMoE runs layer l on a device and on the CPU for each token count,
// with the input rounded to bf16 for both, and requires a relative error of
// at most 1e-2 (the device rounds its activations to bf16 too).
func checkMoE(t *testing.T, dev cuda.Launcher, l *moe.Layer, tokens ...int) {
	t.Helper()
	g, err := cuda.NewMoE(dev, l)
	require.NoError(t, err)
	defer g.Close()
	for _, T := range tokens {
		x := moetest.Input(uint64(T), T, l.Config.Hidden, false)
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
}
