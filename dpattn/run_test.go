package dpattn_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// TestRunParity: the multi-rank decode run equals one rank, bit for bit in
// all-to-all mode and to 1e-6 in gather mode, with idle ranks on the way.
func TestRunParity(t *testing.T) {
	dir, spec := layerFixture(t)
	layer, err := moe.Load(dir, 0)
	require.NoError(t, err)
	defer layer.Close()
	attn, err := dpattn.NewRandomMLABlock(dpattn.AttnConfig{Hidden: spec.Hidden, Heads: 4, KVLoraRank: 64, NopeDim: 16,
		RopeDim: 16, VDim: 16, RopeTheta: 10000, RMSNormEps: 1e-6}, kernels.BF16, 3)
	require.NoError(t, err)
	for _, mode := range []string{"alltoall", "gather"} {
		for _, R := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("%s/ranks=%d", mode, R), func(t *testing.T) {
				rep, err := dpattn.Run(context.Background(), dpattn.RunConfig{Ranks: R, Steps: 5, Mode: mode, Seed: 9,
					MoE: layer, Attn: attn, CacheDType: kernels.F32})
				require.NoError(t, err)
				require.Positive(t, rep.Tokens)
				if mode == "alltoall" {
					require.True(t, rep.ParityExact, "relative error %g", rep.ParityRelErr)
				} else {
					require.LessOrEqual(t, rep.ParityRelErr, 1e-6)
				}
				if R > 1 {
					require.Positive(t, rep.IdleSteps, "the schedule has an idle rank")
				}
			})
		}
	}
	_, err = dpattn.Run(context.Background(), dpattn.RunConfig{Ranks: 2, Steps: 1, Mode: "broadcast", MoE: layer, Attn: attn})
	require.ErrorContains(t, err, `MoE mode "broadcast"`)
}
