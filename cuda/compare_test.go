//go:build cuda || cudaemu

package cuda_test

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
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
		K := l.Config.TopK
		want := make([]float32, len(x))
		wantIDs, wantW := make([]int32, T*K), make([]float32, T*K)
		require.NoError(t, l.ForwardRouting(context.Background(), x, want, wantIDs, wantW))
		got := make([]float32, len(x))
		ids, w := make([]int32, T*K), make([]float32, T*K)
		require.NoError(t, g.ForwardRouting(x, got, ids, w))
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

// mlaCase fills a paged cache with random sequences of the given lengths
// and returns the MLA decode input for it (the cache dense, fp32 or bf16 as
// the cache stores it) with dpattn.MLA's out and lse as the expected values.
func mlaCase(t *testing.T, seed uint64, lens []int32, heads, D, dv, bs, splitRows int, scale float32, dt kernels.DType) (cuda.MLAInput, []float32, []float32) {
	t.Helper()
	blocks := 0
	for _, l := range lens {
		blocks += (int(l) + bs - 1) / bs
	}
	c, err := dpattn.NewLatentCache(blocks, bs, D, dt)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(seed, 1))
	maxBlocks := 0
	for s, l := range lens {
		rows := make([]float32, int(l)*D)
		for i := range rows {
			rows[i] = float32(rng.NormFloat64())
		}
		require.NoError(t, c.Append(s, rows))
		maxBlocks = max(maxBlocks, len(c.BlockTable(s)))
	}
	in := cuda.MLAInput{BlockSize: bs, D: D, MaxBlocks: maxBlocks, SeqLens: lens, Heads: heads, DV: dv,
		SplitRows: splitRows, Scale: scale, BlockTable: make([]int32, len(lens)*maxBlocks)}
	queries := make([]dpattn.Query, len(lens))
	for s := range lens {
		copy(in.BlockTable[s*maxBlocks:], c.BlockTable(s))
		queries[s] = dpattn.Query{Table: c.BlockTable(s), Len: int(lens[s])}
	}
	in.Q = make([]float32, len(lens)*heads*D)
	for i := range in.Q {
		in.Q[i] = float32(rng.NormFloat64())
	}
	for b := 0; b < c.NumBlocks(); b++ {
		m := c.Block(b)
		for r := 0; r < bs; r++ {
			for x := 0; x < D; x++ {
				if dt == kernels.BF16 {
					in.CacheBF16 = append(in.CacheBF16, half.F32ToBF16(m.At(r, x)))
				} else {
					in.CacheF32 = append(in.CacheF32, m.At(r, x))
				}
			}
		}
	}
	want := make([]float32, len(lens)*heads*dv)
	wantLSE := make([]float32, len(lens)*heads)
	require.NoError(t, dpattn.MLA(context.Background(), c, in.Q, queries, heads, dv, scale, want, wantLSE, dpattn.Options{}))
	return in, want, wantLSE
}
