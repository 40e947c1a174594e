//go:build cudaemu

package cudaemu_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/cudaemu"
	"github.com/moex-project/moex/moe"
)

// TestGate: the gating kernel chooses the same experts as the Go router
// from the same logits, for every family's routing, and weights within
// float32 rounding (the Go router works in float64).
func TestGate(t *testing.T) {
	cfgs := []*moe.Config{
		{ModelType: "mixtral", Hidden: 1, NumExperts: 8, TopK: 2, Inter: 1, Scoring: moe.Softmax, Method: moe.Greedy, NormTopK: true, RoutedScaling: 1},
		{ModelType: "qwen3_moe", Hidden: 1, NumExperts: 128, TopK: 8, Inter: 1, Scoring: moe.Softmax, Method: moe.Greedy, RoutedScaling: 1},
		{ModelType: "qwen2_moe", Hidden: 1, NumExperts: 60, TopK: 1, Inter: 1, Scoring: moe.Softmax, Method: moe.Greedy, NormTopK: true, RoutedScaling: 1},
		{ModelType: "deepseek_v2", Hidden: 1, NumExperts: 64, TopK: 6, Inter: 1, Scoring: moe.Softmax, Method: moe.GroupLimitedGreedy, NumGroups: 8, TopKGroups: 3, RoutedScaling: 16},
		{ModelType: "deepseek_v3", Hidden: 1, NumExperts: 256, TopK: 8, Inter: 1, Scoring: moe.Sigmoid, Method: moe.NoAuxTC, NumGroups: 8, TopKGroups: 4, NormTopK: true, RoutedScaling: 2.5},
		{ModelType: "deepseek_v3", Hidden: 1, NumExperts: 16, TopK: 16, Inter: 1, Scoring: moe.Sigmoid, Method: moe.NoAuxTC, NumGroups: 4, TopKGroups: 4, NormTopK: true, RoutedScaling: 1},
		{ModelType: "deepseek_v3", Hidden: 1, NumExperts: 512, TopK: 8, Inter: 1, Scoring: moe.Sigmoid, Method: moe.NoAuxTC, NumGroups: 8, TopKGroups: 4, NormTopK: true, RoutedScaling: 2.5},
		// llama4: the top-k of the raw logits, their sigmoids unnormalised.
		{ModelType: "llama4", Hidden: 1, NumExperts: 16, TopK: 1, Inter: 1, Scoring: moe.Sigmoid, Method: moe.Greedy, ChooseOnLogits: true, WeightOnInput: true, RoutedScaling: 1},
		{ModelType: "llama4", Hidden: 1, NumExperts: 128, TopK: 3, Inter: 1, Scoring: moe.Sigmoid, Method: moe.Greedy, ChooseOnLogits: true, RoutedScaling: 1},
		// ernie4_5_moe's floor under the denominator, large enough to bind.
		{ModelType: "ernie4_5_moe", Hidden: 1, NumExperts: 64, TopK: 6, Inter: 1, Scoring: moe.Softmax, Method: moe.NoAuxTC, NumGroups: 1, TopKGroups: 1, NormTopK: true, NormMin: 0.5, RoutedScaling: 1},
		// deepseek_v4's sqrt(softplus) scores.
		{ModelType: "deepseek_v4", Hidden: 1, NumExperts: 256, TopK: 6, Inter: 1, Scoring: moe.SqrtSoftplus, Method: moe.NoAuxTC, NumGroups: 1, TopKGroups: 1, NormTopK: true, NormEps: 1e-20, RoutedScaling: 1.5},
	}
	for i, cfg := range cfgs {
		for _, T := range []int{0, 1, 37} {
			t.Run(fmt.Sprintf("%s/E=%d/k=%d/T=%d", cfg.ModelType, cfg.NumExperts, cfg.TopK, T), func(t *testing.T) {
				require.NoError(t, cfg.Validate())
				rng := rand.New(rand.NewPCG(uint64(i), uint64(T)))
				E := cfg.NumExperts
				logits := make([]float32, T*E)
				wide := make([]float64, T*E)
				// Large logits for a choice on the logits: their fp32
				// sigmoids saturate to ties the logits do not have.
				scale := 2.0
				if cfg.ChooseOnLogits {
					scale = 20
				}
				for j := range logits {
					logits[j] = float32(rng.NormFloat64() * scale)
					wide[j] = float64(logits[j])
				}
				var bias []float32
				if cfg.Method == moe.NoAuxTC {
					bias = make([]float32, E)
					for j := range bias {
						bias[j] = float32(rng.NormFloat64() * 0.05)
					}
				}
				w, err := kernels.NewF32(E, 1, make([]float32, E))
				require.NoError(t, err)
				router, err := moe.NewRouter(cfg, w, bias)
				require.NoError(t, err)
				wantIDs := make([]int32, T*cfg.TopK)
				wantW := make([]float32, T*cfg.TopK)
				router.RouteLogits(wide, wantIDs, wantW)
				ids, weights, err := cudaemu.Gate(cfg.GateKernelArgs(), logits, bias)
				require.NoError(t, err)
				require.Equal(t, wantIDs, ids)
				for j := range weights {
					require.InDelta(t, wantW[j], weights[j], 1e-5*math.Max(1, math.Abs(float64(wantW[j]))), "weight %d", j)
				}
			})
		}
	}
	_, _, err := cudaemu.Gate((&moe.Config{NumExperts: 2048, TopK: 2}).GateKernelArgs(), nil, nil)
	require.ErrorContains(t, err, "exceed the fused kernel")
}

// TestAlign: the layout kernel equals kernels.NewLayout, with ragged and
// empty experts, one token, and padding blocks.
func TestAlign(t *testing.T) {
	for _, c := range []struct{ tokens, k, experts, block int }{
		{1, 1, 4, 1}, {1, 6, 64, 16}, {37, 2, 8, 4}, {100, 8, 256, 64}, {13, 3, 5, 7}, {0, 2, 4, 4},
	} {
		t.Run(fmt.Sprintf("%+v", c), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.tokens), uint64(c.experts)))
			ids := make([]int32, 0, c.tokens*c.k)
			hot := c.experts / 3 // ragged: a third of the experts stay empty
			for range c.tokens {
				perm := rng.Perm(c.experts - hot)[:c.k]
				row := make([]int32, c.k)
				for j, e := range perm {
					row[j] = int32(e + hot)
				}
				for a := 1; a < c.k; a++ {
					for b := a; b > 0 && row[b] < row[b-1]; b-- {
						row[b], row[b-1] = row[b-1], row[b]
					}
				}
				ids = append(ids, row...)
			}
			want, err := kernels.NewLayout(ids, c.tokens, c.k, c.experts, c.block)
			require.NoError(t, err)
			got, blockExpert, err := cudaemu.Align(ids, c.tokens, c.k, 0, c.experts, c.block)
			require.NoError(t, err)
			require.Equal(t, want.Counts, got.Counts)
			require.Equal(t, want.Offsets, got.Offsets)
			require.Equal(t, want.Pairs, got.Pairs)
			require.Equal(t, want.Rows, got.Rows)
			for b, e := range blockExpert {
				require.True(t, want.Offsets[e] <= int32(b*c.block) && int32(b*c.block) < want.Offsets[e+1], "block %d → expert %d", b, e)
			}
		})
	}
}

// TestAlignShard: over a rank's shard of experts the layout holds the
// shard's pairs only, in its own numbering, and marks the others' rows -1;
// the combine then sums the shard's rows only.
func TestAlignShard(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	const T, K, E, H, block = 37, 4, 16, 24, 8
	ids := make([]int32, 0, T*K)
	for range T {
		row := rng.Perm(E)[:K]
		slices.Sort(row)
		for _, e := range row {
			ids = append(ids, int32(e))
		}
	}
	for _, shard := range [][2]int{{0, 5}, {5, 6}, {11, 5}, {0, E}} {
		lo, n := shard[0], shard[1]
		lay, blockExpert, err := cudaemu.Align(ids, T, K, lo, n, block)
		require.NoError(t, err)
		// The reference: each shard expert's pairs in pair order, padded.
		off := int32(0)
		rows := slices.Repeat([]int32{-1}, T*K)
		for e := 0; e < n; e++ {
			require.Equal(t, off, lay.Offsets[e], "shard %v expert %d", shard, e)
			next := off
			for p, id := range ids {
				if int(id) == lo+e {
					require.Equal(t, int32(p), lay.Pairs[next])
					rows[p] = next
					next++
				}
			}
			require.Equal(t, next-off, lay.Counts[e])
			for ; next%block != 0; next++ {
				require.Equal(t, int32(T*K), lay.Pairs[next], "padding holds the sentinel")
			}
			for b := off / block; b < next/block; b++ {
				require.Equal(t, int32(e), blockExpert[b])
			}
			off = next
		}
		require.Equal(t, off, lay.Offsets[n])
		require.Equal(t, rows, lay.Rows)

		out := make([]float32, int(off)*H)
		for i := range out {
			out[i] = float32(rng.NormFloat64())
		}
		got := make([]float32, T*H)
		cudaemu.Combine(got, out, lay.Rows, K, H, nil)
		for tok := 0; tok < T; tok++ {
			for h := 0; h < H; h++ {
				var want float32 // Σ in slot order, from the first of the shard's rows
				first := true
				for j := 0; j < K; j++ {
					if r := rows[tok*K+j]; r >= 0 {
						if first {
							want, first = out[int(r)*H+h], false
						} else {
							want += out[int(r)*H+h]
						}
					}
				}
				require.Equal(t, math.Float32bits(want), math.Float32bits(got[tok*H+h]), "shard %v token %d", shard, tok)
			}
		}
	}
}

// TestCombine: the combine kernel has the bits of moe.Combine.
func TestCombine(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	const T, K, H = 9, 3, 70
	out := make([]float32, T*K*H)
	for i := range out {
		out[i] = float32(rng.NormFloat64())
	}
	shared := make([]float32, T*H)
	for i := range shared {
		shared[i] = float32(rng.NormFloat64())
	}
	rows := make([]int32, T*K)
	for i, p := range rng.Perm(T * K) {
		rows[i] = int32(p)
	}
	for _, sh := range [][]float32{nil, shared} {
		want := make([]float32, T*H)
		moe.Combine(want, out, rows, K, H, sh)
		got := make([]float32, T*H)
		cudaemu.Combine(got, out, rows, K, H, sh)
		require.Equal(t, want, got)
	}
}

// pagedCache is a cache of 20 blocks of bs rows of D values in dt, holding
// random rows for sequences of lens; the block table [len(lens),
// maxBlocks], each sequence's query over all of its rows, and the cache as
// the kernels read it: dense fp32, or bf16 bits (the other nil).
func pagedCache(t *testing.T, rng *rand.Rand, lens []int32, bs, D int, dt kernels.DType) (*attn.Cache, []int32, int, []attn.Query, []float32, []uint16) {
	t.Helper()
	cache, err := attn.NewCache(20, bs, D, dt)
	require.NoError(t, err)
	maxBlocks := 0
	for s, l := range lens {
		rows := make([]float32, int(l)*D)
		for i := range rows {
			rows[i] = float32(rng.NormFloat64())
		}
		require.NoError(t, cache.Append(s, rows))
		maxBlocks = max(maxBlocks, len(cache.BlockTable(s)))
	}
	table := make([]int32, len(lens)*maxBlocks)
	queries := make([]attn.Query, len(lens))
	for s := range lens {
		bt := cache.BlockTable(s)
		copy(table[s*maxBlocks:], bt)
		queries[s] = attn.Query{Table: bt, Len: int(lens[s])}
	}
	var f32 []float32
	var u16 []uint16
	for blk := 0; blk < cache.NumBlocks(); blk++ {
		m := cache.Block(blk)
		for r := 0; r < bs; r++ {
			for x := 0; x < D; x++ {
				if dt == kernels.BF16 {
					u16 = append(u16, half.F32ToBF16(m.At(r, x)))
				} else {
					f32 = append(f32, m.At(r, x))
				}
			}
		}
	}
	return cache, table, maxBlocks, queries, f32, u16
}

// TestMLADecode: the MLA decode kernels against attn.MLA, fp32 and bf16
// caches, lengths 1, a block boundary and several blocks, split and not.
func TestMLADecode(t *testing.T) {
	const heads, D, dv, bs = 2, 72, 64, 16
	lens := []int32{1, 16, 17, 90}
	for _, bf16 := range []bool{false, true} {
		for _, split := range []int{32, 1000} {
			t.Run(fmt.Sprintf("bf16=%v/split=%d", bf16, split), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(8, uint64(split)))
				dt := kernels.F32
				if bf16 {
					dt = kernels.BF16
				}
				cache, table, maxBlocks, queries, f32, u16 := pagedCache(t, rng, lens, bs, D, dt)
				q := make([]float32, len(lens)*heads*D)
				for i := range q {
					q[i] = float32(rng.NormFloat64())
				}
				want := make([]float32, len(lens)*heads*dv)
				wantLSE := make([]float32, len(lens)*heads)
				require.NoError(t, attn.MLA(context.Background(), cache, q, queries, attn.MLAParams{Heads: heads, ValueDim: dv, Scale: 0.1}, want, wantLSE))
				got, lse, err := cudaemu.MLADecode(q, f32, u16, bs, D, table, maxBlocks, lens, heads, dv, split, 0.1)
				require.NoError(t, err)
				for i := range want {
					require.InDelta(t, want[i], got[i], 1e-5*(1+math.Abs(float64(want[i]))), "out %d", i)
				}
				for i := range wantLSE {
					require.InDelta(t, wantLSE[i], lse[i], 1e-5*(1+math.Abs(float64(wantLSE[i]))), "lse %d", i)
				}
			})
		}
	}
}

// TestGQADecode: the decode kernels in grouped-query form against
// attn.GQA: four query heads over two key/value heads, keys then values in
// each cached row, fp32 and bf16 caches, split and not, with and without a
// window and learned sinks.
func TestGQADecode(t *testing.T) {
	const heads, kvh, dk, dv, bs = 4, 2, 24, 16, 16
	const D = kvh * (dk + dv)
	lens := []int32{1, 16, 17, 70}
	for _, bf16 := range []bool{false, true} {
		for _, split := range []int{8, 1000} {
			for _, window := range []int{0, 5} {
				for _, sinks := range [][]float32{nil, {0.3, -2, 1.5, 0}} {
					t.Run(fmt.Sprintf("bf16=%v/split=%d/window=%d/sinks=%v", bf16, split, window, sinks != nil), func(t *testing.T) {
						rng := rand.New(rand.NewPCG(9, uint64(split+window)))
						dt := kernels.F32
						if bf16 {
							dt = kernels.BF16
						}
						cache, table, maxBlocks, queries, f32, u16 := pagedCache(t, rng, lens, bs, D, dt)
						q := make([]float32, len(lens)*heads*dk)
						for i := range q {
							q[i] = float32(rng.NormFloat64())
						}
						want := make([]float32, len(lens)*heads*dv)
						p := attn.GQAParams{Heads: heads, KVHeads: kvh, KeyDim: dk, ValueDim: dv, Scale: 0.2, Window: window, Sinks: sinks}
						require.NoError(t, attn.GQA(context.Background(), cache, q, queries, p, want))
						shape := cudaemu.AttnShape{Heads: heads, KVHeads: kvh, KeyDim: dk, ValueDim: dv, ValueOff: kvh * dk, Window: window}
						got, _, err := cudaemu.AttnDecode(q, f32, u16, bs, D, table, maxBlocks, lens, shape, split, 0.2, sinks)
						require.NoError(t, err)
						for i := range want {
							require.InDelta(t, want[i], got[i], 1e-5*(1+math.Abs(float64(want[i]))), "out %d", i)
						}
					})
				}
			}
		}
	}
}

// TestGroupedGEMM: the tensor-core grouped GEMM (mma.sync emulated with the
// PTX fragment layouts) against a float64 product of the same bf16 values,
// with ragged and empty experts, one token, N not a multiple of the tile.
func TestGroupedGEMM(t *testing.T) {
	for _, c := range []struct{ tokens, k, experts, N, K int }{
		{1, 1, 4, 8, 16}, {37, 2, 6, 40, 48}, {130, 3, 8, 72, 32},
	} {
		t.Run(fmt.Sprintf("%+v", c), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.tokens), 9))
			bf := func(n int) ([]uint16, []float64) {
				u := make([]uint16, n)
				f := make([]float64, n)
				for i := range u {
					u[i] = half.F32ToBF16(float32(rng.NormFloat64()))
					f[i] = float64(half.BF16ToF32(u[i]))
				}
				return u, f
			}
			a, af := bf(c.tokens * c.K)
			w, wf := bf(c.experts * c.N * c.K)
			ids := make([]int32, 0, c.tokens*c.k)
			for range c.tokens {
				perm := rng.Perm(c.experts - 1)[:c.k] // the last expert stays empty
				for x := 1; x < c.k; x++ {
					for y := x; y > 0 && perm[y] < perm[y-1]; y-- {
						perm[y], perm[y-1] = perm[y-1], perm[y]
					}
				}
				for _, e := range perm {
					ids = append(ids, int32(e))
				}
			}
			weights := make([]float32, len(ids))
			for i := range weights {
				weights[i] = rng.Float32()
			}
			lay, blockExpert, err := cudaemu.Align(ids, c.tokens, c.k, 0, c.experts, cudaemu.GemmBlock)
			require.NoError(t, err)
			got, err := cudaemu.GroupedGEMMBF16(a, w, lay, blockExpert, c.N, c.K, weights)
			require.NoError(t, err)
			up, uf := bf(c.experts * c.N * c.K)
			h, err := cudaemu.GroupedSwiGLUBF16(a, w, up, lay, blockExpert, c.N, c.K)
			require.NoError(t, err)
			sentinel := int32(c.tokens * c.k)
			for r, p := range lay.Pairs {
				for n := 0; n < c.N; n++ {
					g := got[r*c.N+n]
					if p == sentinel {
						require.Zero(t, g, "padding row %d", r)
						require.Zero(t, h[r*c.N+n], "padding row %d", r)
						continue
					}
					tok, e := int(p)/c.k, int(ids[p])
					var want, up64, mag, magU float64
					for k := 0; k < c.K; k++ {
						x := af[tok*c.K+k] * wf[(e*c.N+n)*c.K+k]
						want += x
						mag += math.Abs(x)
						y := af[tok*c.K+k] * uf[(e*c.N+n)*c.K+k]
						up64 += y
						magU += math.Abs(y)
					}
					swiglu := want / (1 + math.Exp(-want)) * up64
					require.InDelta(t, swiglu, float64(h[r*c.N+n]), 1e-5*(mag*math.Abs(up64)+magU*math.Abs(want))+1e-6, "swiglu row %d col %d", r, n)
					want *= float64(weights[p])
					require.InDelta(t, want, float64(g), 1e-5*mag+1e-6, "row %d (pair %d) col %d", r, p, n)
				}
			}
		})
	}
}

// TestHalfScales: integer codes with fp16 scales (the scales' form 2 of
// the kernel's kind) dequantize each scale exactly: a GEMM of one token
// (1 at k = 0) against rows of code 1 at k = 0 returns each row's weight,
// bf16(scale), for every fp16 subnormal, a sweep of the normals, the
// largest, their negatives and zero, against Go's fp16 reading.
func TestHalfScales(t *testing.T) {
	var hs []uint16
	for h := uint16(1); h < 0x0400; h++ { // the subnormals
		hs = append(hs, h)
	}
	for h := uint16(0x0400); h < 0x7c00; h += 7 { // the normals, every 7th
		hs = append(hs, h)
	}
	hs = append(hs, 0x7bff)
	for _, h := range hs[:len(hs):len(hs)] {
		hs = append(hs, h|0x8000)
	}
	hs = append(hs, 0) // (−0's product sums to +0 in the GEMM, as on the CPU)
	const K = 32
	N := len(hs)
	codes := make([]int8, N*K)
	for n := range N {
		codes[n*K] = 1
	}
	a := make([]uint16, K)
	a[0] = half.F32ToBF16(1)
	lay, blockExpert, err := cudaemu.Align([]int32{0}, 1, 1, 0, 1, cudaemu.GemmBlock)
	require.NoError(t, err)
	c := make([]float32, len(lay.Pairs)*N)
	const int8Codes, halfScales = 3, 2 << 4
	cudaemu.GroupedGEMMCodesRaw(unsafe.Pointer(&a[0]), unsafe.Pointer(&codes[0]), unsafe.Pointer(&hs[0]), nil, K, int8Codes|halfScales,
		nil, 0, unsafe.Pointer(&lay.Pairs[0]), unsafe.Pointer(&blockExpert[0]), len(lay.Pairs), 1, 1, true, N, K, nil, cudaemu.Epilogue{},
		unsafe.Pointer(&c[0]))
	row := slices.Index(lay.Pairs, 0)
	require.GreaterOrEqual(t, row, 0)
	for n, h := range hs {
		want := half.BF16ToF32(half.F32ToBF16(half.F16ToF32(h)))
		require.Equal(t, math.Float32bits(want), math.Float32bits(c[row*N+n]), "fp16 %#04x", h)
	}
}
