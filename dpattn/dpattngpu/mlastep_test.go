//go:build cudaemu && !cuda

package dpattngpu_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/dpattn/dpattngpu"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
)

// TestMLAStepOnEmulation: the MLA block's decode step with its activations
// in device memory against the block on the host plus the residual, over
// prefilled sequences (several cache blocks each) and decode steps of
// different batch sizes; the rows it writes reach the host cache; replayed
// graphs give the eager bits.
func TestMLAStepOnEmulation(t *testing.T) {
	for _, qLora := range []bool{true, false} {
		t.Run(fmt.Sprintf("q_lora=%v", qLora), func(t *testing.T) {
			cfg := attn.MLAConfig{Hidden: 64, Heads: 2, KVLoraRank: 48, NopeDim: 16, RopeDim: 16, VDim: 32,
				RopeTheta: 10000, RMSNormEps: 1e-6}
			if qLora {
				r := 32
				cfg.QLoraRank = &r
				cfg.Scaling = &arch.RoPEScaling{Type: "yarn", Factor: 4, OrigMaxPos: 64, BetaFast: 32, BetaSlow: 1, MScale: 0.707,
					MScaleAllDm: 0.707}
			}
			blk, err := attn.NewRandomMLABlock(cfg, kernels.BF16, 6)
			require.NoError(t, err)
			D := cfg.KVLoraRank + cfg.RopeDim
			newCache := func() *attn.Cache {
				c, err := attn.NewCache(12, 16, D, kernels.BF16)
				require.NoError(t, err)
				rng := rand.New(rand.NewPCG(3, 3))
				for seq, n := range []int{5, 15, 40} { // sequence 1 crosses into a new block on its second step
					rows := make([]float32, n*D)
					for i := range rows {
						rows[i] = float32(rng.NormFloat64())
					}
					require.NoError(t, c.Append(seq, rows))
				}
				return c
			}
			host := newCache()
			steps := [][]int{{0, 1, 2}, {0, 2}, {0, 1, 2}, {1}}
			// run gives every step's outputs on a fresh cache, and the cache.
			run := func(att *dpattngpu.Attention) ([][]float32, *attn.Cache) {
				c := newCache()
				var outs [][]float32
				for st, seqs := range steps {
					x := moetest.Input(uint64(10+st), len(seqs), cfg.Hidden, false)
					got := make([]float32, len(x))
					require.NoError(t, att.Step(context.Background(), blk, c, seqs, x, got))
					outs = append(outs, got)
				}
				return outs, c
			}
			att := dpattngpu.NewAttention(cuda.NewEmu())
			defer att.Close()
			eager, dev := run(att)
			for st, seqs := range steps {
				x := moetest.Input(uint64(10+st), len(seqs), cfg.Hidden, false)
				want := make([]float32, len(x))
				require.NoError(t, blk.Forward(context.Background(), host, seqs, x, want))
				ref := make([]float64, len(want))
				for i := range want {
					ref[i] = float64(want[i] + x[i])
				}
				e := moetest.RelErr(eager[st], ref)
				t.Logf("step %d (%d tokens): relative error %.2e against the host block", st, len(seqs), e)
				require.Less(t, e, 1e-2)
				require.Greater(t, e, 0.0, "the device rounds to bf16: the same bits would mean it did not run")
			}
			// The rows the device wrote are in the host cache, as the host
			// block wrote its own.
			for seq := 0; seq < 3; seq++ {
				require.Equal(t, host.Len(seq), dev.Len(seq))
				require.Equal(t, host.BlockTable(seq), dev.BlockTable(seq))
			}
			var num, den float64
			for b := 0; b < dev.NumBlocks(); b++ {
				hb, db := host.Block(b), dev.Block(b)
				w, g := make([]float32, D), make([]float32, D)
				for r := 0; r < 16; r++ {
					hb.RowF32(r, w)
					db.RowF32(r, g)
					for i := range w {
						num += float64(g[i]-w[i]) * float64(g[i]-w[i])
						den += float64(w[i]) * float64(w[i])
					}
				}
			}
			t.Logf("caches: relative difference %.2e", math.Sqrt(num/den))
			require.Less(t, math.Sqrt(num/den), 1e-2)
			require.Greater(t, num, 0.0, "the new rows were computed on the device")

			graphed := dpattngpu.NewAttention(cuda.NewEmu())
			defer graphed.Close()
			graphed.EnableGraphs()
			graphed.AllowGraph(true)
			replayed, c := run(graphed)
			require.Equal(t, eager, replayed, "a replay gives the eager bits")
			require.EqualValues(t, len(steps), graphed.GraphReplays())

			// A forgotten cache gets a new device copy from the host's rows,
			// the device-written ones included (those of sequence 1's new
			// block too): the same bits as the copy that never left.
			graphed.Forget(c)
			for i, seq := range []int{2, 1} {
				x := moetest.Input(uint64(90+i), 1, cfg.Hidden, false)
				want, kept, got := make([]float32, len(x)), make([]float32, len(x)), make([]float32, len(x))
				require.NoError(t, blk.Forward(context.Background(), host, []int{seq}, x, want))
				require.NoError(t, att.Step(context.Background(), blk, dev, []int{seq}, x, kept))
				require.NoError(t, graphed.Step(context.Background(), blk, c, []int{seq}, x, got))
				require.Equal(t, kept, got, "sequence %d after Forget", seq)
				ref := make([]float64, len(want))
				for i := range want {
					ref[i] = float64(want[i] + x[i])
				}
				require.Less(t, moetest.RelErr(got, ref), 1e-2)
			}

			// A step that cannot reserve every row takes back those it did.
			full, err := attn.NewCache(2, 16, D, kernels.BF16)
			require.NoError(t, err)
			require.NoError(t, full.Append(0, make([]float32, 3*D)))
			require.NoError(t, full.Append(1, make([]float32, 16*D)))
			x := moetest.Input(97, 2, cfg.Hidden, false)
			err = graphed.Step(context.Background(), blk, full, []int{0, 1}, x, make([]float32, len(x)))
			require.ErrorContains(t, err, "cache exhausted: sequence 1 needs 1 more blocks, 0 of 2 are free")
			require.Equal(t, 3, full.Len(0), "the row reserved for sequence 0 is given back")
			require.Equal(t, 16, full.Len(1))
			x[5] = float32(math.NaN())
			require.ErrorContains(t, graphed.Step(context.Background(), blk, full, []int{0, 1}, x, make([]float32, len(x))), "NaN")
		})
	}
}

// TestMLAStepForgetRace: Forget while steps run on the same cache: each
// step runs on a live device copy (a fresh one after a Forget, synced from
// the host's rows) and matches the host block.
func TestMLAStepForgetRace(t *testing.T) {
	cfg := attn.MLAConfig{Hidden: 32, Heads: 2, KVLoraRank: 32, NopeDim: 16, RopeDim: 16, VDim: 16, RopeTheta: 10000,
		RMSNormEps: 1e-6}
	blk, err := attn.NewRandomMLABlock(cfg, kernels.BF16, 8)
	require.NoError(t, err)
	D := cfg.KVLoraRank + cfg.RopeDim
	host, err := attn.NewCache(4, 16, D, kernels.BF16)
	require.NoError(t, err)
	dev, err := attn.NewCache(4, 16, D, kernels.BF16)
	require.NoError(t, err)
	rows := moetest.Input(1, 9, D, false)
	require.NoError(t, host.Append(0, rows))
	require.NoError(t, dev.Append(0, rows))
	att := dpattngpu.NewAttention(cuda.NewEmu())
	defer att.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 20; i++ {
			att.Forget(dev)
		}
	}()
	for st := 0; st < 4; st++ {
		x := moetest.Input(uint64(st), 1, cfg.Hidden, false)
		want, got := make([]float32, len(x)), make([]float32, len(x))
		require.NoError(t, blk.Forward(context.Background(), host, []int{0}, x, want))
		require.NoError(t, att.Step(context.Background(), blk, dev, []int{0}, x, got))
		ref := make([]float64, len(want))
		for i := range want {
			ref[i] = float64(want[i] + x[i])
		}
		require.Less(t, moetest.RelErr(got, ref), 1e-2, "step %d", st)
	}
	<-done
}
