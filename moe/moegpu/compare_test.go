//go:build cuda || cudaemu

package moegpu_test

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/moe"
	"github.com/moex-project/moex/moe/moegpu"
)

// checkMoE runs layer l on a device and on the CPU for each token count,
// with the input rounded to bf16 for both, and requires a relative error of
// at most 1e-2 (the device rounds its activations to bf16 too).
func checkMoE(t *testing.T, dev cuda.Launcher, l *moe.Layer, tokens ...int) {
	t.Helper()
	g, err := moegpu.NewMoE(dev, l)
	require.NoError(t, err)
	defer g.Close()
	for _, T := range tokens {
		x := moetest.Input(uint64(T), T, l.Config.Hidden, false)
		for i, v := range x {
			x[i] = half.BF16ToF32(half.F32ToBF16(v))
		}
		K := l.Config.TopK
		want := make([]float32, len(x))
		wantIDs, wantW := make([]int32, T*K), make([]float32, T*K)
		require.NoError(t, l.ForwardRouting(context.Background(), x, want, wantIDs, wantW))
		got := make([]float32, len(x))
		ids, w := make([]int32, T*K), make([]float32, T*K)
		require.NoError(t, g.ForwardRouting(context.Background(), x, got, ids, w))
		ref := make([]float64, len(want))
		for i, v := range want {
			ref[i] = float64(v)
		}
		e := moetest.RelErr(got, ref)
		// The device's logits are bf16·bf16 in fp32, the CPU's float64: a
		// near tie may pick another expert, rarely.
		same := 0
		for tok := 0; tok < T; tok++ {
			if slices.Equal(ids[tok*K:(tok+1)*K], wantIDs[tok*K:(tok+1)*K]) {
				same++
				for j := tok * K; j < (tok+1)*K; j++ {
					require.InDelta(t, wantW[j], w[j], 1e-2*(1+math.Abs(float64(wantW[j]))), "token %d weight %d", tok, j-tok*K)
				}
			}
		}
		t.Logf("%d tokens: relative error %.2e, same experts for %d", T, e, same)
		require.LessOrEqual(t, e, 1e-2)
		require.GreaterOrEqual(t, same, T-max(1, T/20), "tokens routed to other experts than on the CPU")
	}
}
