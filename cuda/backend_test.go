//go:build cudaemu && !cuda

package cuda_test

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/dpattn"
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
	const heads, D, dv, bs = 2, 64, 48, 16
	lens := []int32{1, 16, 50}
	c, err := dpattn.NewLatentCache(12, bs, D, kernels.F32)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(2, 3))
	maxBlocks := 0
	for s, l := range lens {
		rows := make([]float32, int(l)*D)
		for i := range rows {
			rows[i] = float32(rng.NormFloat64())
		}
		require.NoError(t, c.Append(s, rows))
		maxBlocks = max(maxBlocks, len(c.BlockTable(s)))
	}
	in := cuda.MLAInput{BlockSize: bs, D: D, MaxBlocks: maxBlocks, SeqLens: lens, Heads: heads, DV: dv, SplitRows: 20, Scale: 0.2,
		BlockTable: make([]int32, len(lens)*maxBlocks)}
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
				in.CacheF32 = append(in.CacheF32, m.At(r, x))
			}
		}
	}
	want := make([]float32, len(lens)*heads*dv)
	wantLSE := make([]float32, len(lens)*heads)
	require.NoError(t, dpattn.MLA(context.Background(), c, in.Q, queries, heads, dv, 0.2, want, wantLSE, dpattn.Options{}))
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
