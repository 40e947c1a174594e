//go:build cudaemu && !cuda

package dpattngpu_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/dpattn/dpattngpu"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/kerneltest"
)

// TestMLADecodeOnEmulation: MLA decode through the device launch code
// against attn.MLA.
func TestMLADecodeOnEmulation(t *testing.T) {
	in, want, wantLSE := mlaCase(t, 2, []int32{1, 16, 50}, 2, 64, 48, 16, 20, 0.2, kernels.F32)
	got, lse, err := dpattngpu.MLADecode(cuda.NewEmu(), in)
	require.NoError(t, err)
	for i := range want {
		require.InDelta(t, want[i], got[i], 1e-5*(1+math.Abs(float64(want[i]))))
	}
	for i := range wantLSE {
		require.InDelta(t, wantLSE[i], lse[i], 1e-5*(1+math.Abs(float64(wantLSE[i]))))
	}
	_, _, err = dpattngpu.MLADecode(cuda.NewEmu(), dpattngpu.MLAInput{SeqLens: []int32{0}, Q: make([]float32, 4), D: 4, DV: 4, Heads: 1,
		BlockSize: 1, MaxBlocks: 1, BlockTable: []int32{0}, SplitRows: 1})
	require.ErrorContains(t, err, "sequence 0 has length 0")
}

// TestAttentionOnEmulation: the DeepSeek attention block with its MLA core
// on the device (a synced copy of the cache) against the same block on the
// host, over prefilled sequences and several decode steps.
func TestAttentionOnEmulation(t *testing.T) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			cfg := attn.MLAConfig{Hidden: 32, Heads: 2, KVLoraRank: 48, NopeDim: 16, RopeDim: 16, VDim: 16,
				RopeTheta: 10000, RMSNormEps: 1e-6}
			blk, err := attn.NewRandomMLABlock(cfg, kernels.BF16, 4)
			require.NoError(t, err)
			host, err := attn.NewCache(12, 16, 64, dt)
			require.NoError(t, err)
			dev, err := attn.NewCache(12, 16, 64, dt)
			require.NoError(t, err)
			att := dpattngpu.NewAttention(cuda.NewEmu())
			defer att.Close()
			att.SplitRows = 16 // several splits: the merge kernel runs too
			devBE := attn.Backend{Core: att}
			rng := rand.New(rand.NewPCG(7, 8))
			for s, n := range []int{5, 40, 17} {
				rows := make([]float32, n*64)
				for i := range rows {
					rows[i] = float32(rng.NormFloat64())
				}
				require.NoError(t, host.Append(s, rows))
				require.NoError(t, dev.Append(s, rows))
			}
			for step := 0; step < 3; step++ {
				seqs := []int{0, 1, 2}
				x := moetest.Input(uint64(step), len(seqs), cfg.Hidden, false)
				want, got := make([]float32, len(x)), make([]float32, len(x))
				require.NoError(t, blk.Forward(context.Background(), host, seqs, x, want))
				require.NoError(t, blk.ForwardWith(context.Background(), devBE, dev, seqs, x, got))
				for i := range want {
					require.InDelta(t, want[i], got[i], 1e-4*(1+math.Abs(float64(want[i]))), "step %d value %d", step, i)
				}
			}
		})
	}
}

// TestGQABlockOnEmulation: a grouped-query block (gpt-oss-like: biases,
// sinks, a window) with its attention on the device against the same block
// on the host: a prefill then decode steps, fp32 and bf16 caches.
func TestGQABlockOnEmulation(t *testing.T) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			r, _, err := kernels.NewRoPE(8, 10000, kernels.RoPEScaling{}, kernels.RoPEHalves)
			require.NoError(t, err)
			cfg := attn.GQAConfig{Hidden: 32, Heads: 4, KVHeads: 2, HeadDim: 8, Bias: true, OutBias: true, Sinks: true, Window: 6,
				NormEps: 1e-6, RoPE: r, Scale: float32(1 / math.Sqrt(8))}
			blk, err := attn.NewRandomGQABlock(cfg, kernels.BF16, 5)
			require.NoError(t, err)
			host, err := attn.NewCache(12, 4, blk.RowDim(), dt)
			require.NoError(t, err)
			dev, err := attn.NewCache(12, 4, blk.RowDim(), dt)
			require.NoError(t, err)
			att := dpattngpu.NewAttention(cuda.NewEmu())
			defer att.Close()
			att.SplitRows = 4 // several splits: the merge (with the sinks) runs too
			devBE := attn.Backend{Core: att}
			for step, seqs := range [][]int{{0, 0, 0, 0, 0, 0, 0, 1, 1, 1}, {0, 1}, {0, 1}, {1}} {
				x := moetest.Input(uint64(step), len(seqs), cfg.Hidden, false)
				want, got := make([]float32, len(x)), make([]float32, len(x))
				require.NoError(t, blk.Forward(context.Background(), host, seqs, x, want))
				require.NoError(t, blk.ForwardWith(context.Background(), devBE, dev, seqs, x, got))
				for i := range want {
					require.InDelta(t, want[i], got[i], 1e-4*(1+math.Abs(float64(want[i]))), "step %d value %d", step, i)
				}
			}
		})
	}
}

// TestAttentionGraphsOnEmulation: replayed graphs of MLA decode (queries
// and splits padded to their buckets) give the eager bits, across batches
// of different sizes and sequences that grow into a larger split bucket;
// a step the vote does not allow runs eagerly.
func TestAttentionGraphsOnEmulation(t *testing.T) {
	cfg := attn.MLAConfig{Hidden: 32, Heads: 2, KVLoraRank: 48, NopeDim: 16, RopeDim: 16, VDim: 16,
		RopeTheta: 10000, RMSNormEps: 1e-6}
	blk, err := attn.NewRandomMLABlock(cfg, kernels.BF16, 4)
	require.NoError(t, err)
	var caches [2]*attn.Cache
	var cores [2]*dpattngpu.Attention
	var backends [2]attn.Backend
	for i := range caches {
		caches[i], err = attn.NewCache(12, 16, 64, kernels.BF16)
		require.NoError(t, err)
		cores[i] = dpattngpu.NewAttention(cuda.NewEmu())
		defer cores[i].Close()
		cores[i].SplitRows = 16
		backends[i] = attn.Backend{Core: cores[i]}
	}
	cores[1].EnableGraphs()
	rng := rand.New(rand.NewPCG(9, 10))
	for s, n := range []int{5, 62, 17} {
		rows := make([]float32, n*64)
		for i := range rows {
			rows[i] = float32(rng.NormFloat64())
		}
		for _, c := range caches {
			require.NoError(t, c.Append(s, rows))
		}
	}
	steps := [][]int{{0, 1, 2}, {1}, {0, 2}, {1, 2}, {0, 1, 2}, {1}}
	for step, seqs := range steps {
		cores[1].AllowGraph(step != 2)
		x := moetest.Input(uint64(step), len(seqs), cfg.Hidden, false)
		want, got := make([]float32, len(x)), make([]float32, len(x))
		require.NoError(t, blk.ForwardWith(context.Background(), backends[0], caches[0], seqs, x, want))
		require.NoError(t, blk.ForwardWith(context.Background(), backends[1], caches[1], seqs, x, got))
		require.Equal(t, want, got, "step %d, sequences %v", step, seqs)
	}
	require.Equal(t, 5, cores[1].GraphReplays())
	require.Equal(t, 1, cores[1].EagerRuns())
	require.Equal(t, 0, cores[0].GraphReplays(), "graphs are off unless enabled")
}

// TestProjectionsOnEmulation: the device projector against a float64
// reference over bf16-rounded inputs (as the tensor cores see them): one
// matrix, and heads whose rows span several GEMM blocks; bad shapes are
// named.
func TestProjectionsOnEmulation(t *testing.T) {
	att := dpattngpu.NewAttention(cuda.NewEmu())
	defer att.Close()
	p := att.Projections()
	rng := rand.New(rand.NewPCG(11, 12))
	bf := func(v float32) float64 { return float64(half.BF16ToF32(half.F32ToBF16(v))) }
	for _, c := range []struct{ heads, tokens, n, k int }{{1, 3, 40, 32}, {1, 70, 16, 48}, {3, 70, 24, 16}, {2, 1, 64, 64}} {
		ws := make([]kernels.Matrix, c.heads)
		vals := make([][][]float64, c.heads)
		for h := range ws {
			ws[h], vals[h] = kerneltest.Weights(rng, kernels.BF16, c.n, c.k)
		}
		rows := c.tokens * c.heads
		x := make([]float32, rows*c.k)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		out := make([]float32, rows*c.n)
		if c.heads == 1 {
			require.NoError(t, p.Project(context.Background(), &ws[0], x, out))
		} else {
			require.NoError(t, p.ProjectHeads(context.Background(), ws, x, out))
		}
		for r := 0; r < rows; r++ {
			for n := 0; n < c.n; n++ {
				var want, mag float64
				for k := 0; k < c.k; k++ {
					v := bf(x[r*c.k+k]) * vals[r%c.heads][n][k]
					want += v
					mag += math.Abs(v)
				}
				require.InDelta(t, want, out[r*c.n+n], 1e-5*mag+1e-6, "%+v row %d col %d", c, r, n)
			}
		}
	}
	w, _ := kerneltest.Weights(rng, kernels.BF16, 16, 20)
	require.ErrorContains(t, p.Project(context.Background(), &w, make([]float32, 20), make([]float32, 16)),
		"the device GEMM takes k a positive multiple of 16")
	w, _ = kerneltest.Weights(rng, kernels.BF16, 16, 32)
	require.ErrorContains(t, p.Project(context.Background(), &w, make([]float32, 33), make([]float32, 16)),
		"x has 33 values and out 16")
	require.ErrorContains(t, p.ProjectHeads(context.Background(), nil, nil, nil), "head projection: no heads")
	pair := []kernels.Matrix{w, w}
	require.NoError(t, p.Project(context.Background(), &pair[0], make([]float32, 32), make([]float32, 16)))
	require.ErrorContains(t, p.ProjectHeads(context.Background(), pair, make([]float32, 64), make([]float32, 32)),
		"are on the device as 1 × [16, 32], asked for as 2 × [16, 32]")
	other, _ := kerneltest.Weights(rng, kernels.BF16, 8, 32)
	require.ErrorContains(t, p.ProjectHeads(context.Background(), []kernels.Matrix{w, other}, make([]float32, 64), make([]float32, 32)),
		"head projection: head 1 is [8, 32], head 0 [16, 32]")
}

// TestMLABlockOnEmulation: the whole MLA block with its projections and its
// attention on the device, against the block on the host: within the
// bf16 tolerance of the tensor-core path.
func TestMLABlockOnEmulation(t *testing.T) {
	cfg := attn.MLAConfig{Hidden: 64, Heads: 2, KVLoraRank: 48, NopeDim: 16, RopeDim: 16, VDim: 32,
		RopeTheta: 10000, RMSNormEps: 1e-6}
	r := 32
	cfg.QLoraRank = &r
	blk, err := attn.NewRandomMLABlock(cfg, kernels.BF16, 5)
	require.NoError(t, err)
	host, err := attn.NewCache(8, 16, 64, kernels.BF16)
	require.NoError(t, err)
	dev, err := attn.NewCache(8, 16, 64, kernels.BF16)
	require.NoError(t, err)
	att := dpattngpu.NewAttention(cuda.NewEmu())
	defer att.Close()
	devBE := attn.Backend{Core: att, Proj: att.Projections()}
	for step := 0; step < 3; step++ {
		seqs := []int{0, 1, 2}
		if step == 0 {
			seqs = []int{0, 0, 0, 1, 1, 2} // an extend: several tokens of a sequence
		}
		x := moetest.Input(uint64(step), len(seqs), cfg.Hidden, false)
		want, got := make([]float32, len(x)), make([]float32, len(x))
		require.NoError(t, blk.Forward(context.Background(), host, seqs, x, want))
		require.NoError(t, blk.ForwardWith(context.Background(), devBE, dev, seqs, x, got))
		var diff, norm float64
		for i := range want {
			d := float64(got[i] - want[i])
			diff += d * d
			norm += float64(want[i]) * float64(want[i])
		}
		rel := math.Sqrt(diff / norm)
		t.Logf("step %d: relative error %.2e", step, rel)
		require.Less(t, rel, 1e-2, "step %d", step)
		require.Greater(t, rel, 0.0, "the device rounds to bf16: the same bits would mean it did not run")
	}
}

// noGraphs is a device whose captures fail (no memory for a graph, say),
// counting the attempts.
type noGraphs struct {
	cuda.Launcher
	tries *int
}

func (g noGraphs) Capture(func(cuda.Launcher) error) (cuda.Graph, error) {
	*g.tries++
	return nil, errors.New("no graphs here")
}

// TestAttentionGraphCaptureFails: a bucket that cannot be captured runs
// eagerly, with the eager results, and its capture is not tried again.
func TestAttentionGraphCaptureFails(t *testing.T) {
	cfg := attn.MLAConfig{Hidden: 32, Heads: 2, KVLoraRank: 48, NopeDim: 16, RopeDim: 16, VDim: 16,
		RopeTheta: 10000, RMSNormEps: 1e-6}
	blk, err := attn.NewRandomMLABlock(cfg, kernels.BF16, 4)
	require.NoError(t, err)
	var caches [2]*attn.Cache
	captures := 0
	var cores [2]*dpattngpu.Attention
	var backends [2]attn.Backend
	for i, d := range []cuda.Launcher{cuda.NewEmu(), noGraphs{cuda.NewEmu(), &captures}} {
		caches[i], err = attn.NewCache(8, 16, 64, kernels.BF16)
		require.NoError(t, err)
		cores[i] = dpattngpu.NewAttention(d)
		defer cores[i].Close()
		backends[i] = attn.Backend{Core: cores[i]}
	}
	cores[1].EnableGraphs()
	cores[1].AllowGraph(true)
	for step := 0; step < 3; step++ {
		seqs := []int{0, 1}
		x := moetest.Input(uint64(step), len(seqs), cfg.Hidden, false)
		want, got := make([]float32, len(x)), make([]float32, len(x))
		require.NoError(t, blk.ForwardWith(context.Background(), backends[0], caches[0], seqs, x, want))
		require.NoError(t, blk.ForwardWith(context.Background(), backends[1], caches[1], seqs, x, got))
		require.Equal(t, want, got, "step %d", step)
	}
	require.Equal(t, 0, cores[1].GraphReplays())
	require.Equal(t, 3, cores[1].EagerRuns())
	require.Equal(t, 1, captures, "one bucket, tried once")
}
