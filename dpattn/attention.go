package dpattn

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
)

// Attention is an MLA attention block in the absorbed form with its three
// projections: hidden → absorbed queries [heads, latent], hidden → the
// token's latent row, attention outputs [heads, dv] → hidden. The query
// and output projections here already include kv_b_proj's absorbed halves;
// RMS norms and RoPE are not part of it (loading a DeepSeek checkpoint's
// self_attn tensors, which need them, is a later step).
type Attention struct {
	Hidden, Heads, Latent, DV int
	Scale                     float32
	Wq                        kernels.Matrix // [heads·latent, hidden]
	Wkv                       kernels.Matrix // [latent, hidden]
	Wo                        kernels.Matrix // [hidden, heads·dv]
	Workers                   int            // goroutines; 0: GOMAXPROCS
}

// NewRandomAttention makes an attention block of the given shape with
// random weights in dtype (uniform ±1/√fan_in), the same for the same seed.
func NewRandomAttention(hidden, heads, latent, dv int, dtype kernels.DType, seed uint64) (*Attention, error) {
	if hidden < 1 || heads < 1 || latent < 1 || dv < 1 || dv > latent {
		return nil, fmt.Errorf("dpattn: attention of hidden %d, %d heads, latent %d, dv %d", hidden, heads, latent, dv)
	}
	mat := func(stream uint64, rows, cols int) (kernels.Matrix, error) {
		rng := rand.New(rand.NewPCG(seed, stream))
		a := 1 / math.Sqrt(float64(cols))
		if dtype == kernels.F32 {
			v := make([]float32, rows*cols)
			for i := range v {
				v[i] = float32((2*rng.Float64() - 1) * a)
			}
			return kernels.NewF32(rows, cols, v)
		}
		v := make([]uint16, rows*cols)
		for i := range v {
			v[i] = half.F32ToBF16(float32((2*rng.Float64() - 1) * a))
		}
		return kernels.NewHalf(kernels.BF16, rows, cols, v)
	}
	a := &Attention{Hidden: hidden, Heads: heads, Latent: latent, DV: dv, Scale: float32(1 / math.Sqrt(192))}
	var err error
	if a.Wq, err = mat(101, heads*latent, hidden); err != nil {
		return nil, err
	}
	if a.Wkv, err = mat(102, latent, hidden); err != nil {
		return nil, err
	}
	if a.Wo, err = mat(103, hidden, heads*dv); err != nil {
		return nil, err
	}
	return a, nil
}

// Block is an attention block the decode run can drive.
type Block interface {
	HiddenSize() int
	LatentDim() int
	// Forward runs new tokens x [T, hidden] of sequences seqs, appending
	// their latent rows to the cache, and writes out [T, hidden].
	Forward(ctx context.Context, cache *LatentCache, seqs []int, x, out []float32) error
}

// HiddenSize is the model width.
func (a *Attention) HiddenSize() int { return a.Hidden }

// LatentDim is the cached row width.
func (a *Attention) LatentDim() int { return a.Latent }

// Forward is Decode on GOMAXPROCS goroutines.
func (a *Attention) Forward(ctx context.Context, cache *LatentCache, seqs []int, x, out []float32) error {
	return a.Decode(ctx, cache, seqs, x, out, a.Workers)
}

// Decode runs one decode step for tokens x [T, hidden], token t belonging
// to sequence seqs[t]: it appends each token's latent row to the cache,
// attends over the sequence (the new row included) and writes the block's
// output [T, hidden] to out. Each token's result depends only on its own
// sequence.
func (a *Attention) Decode(ctx context.Context, cache *LatentCache, seqs []int, x, out []float32, workers int) error {
	T := len(seqs)
	H, L := a.Hidden, a.Latent
	if len(x) != T*H || len(out) != T*H {
		return fmt.Errorf("dpattn: attention: x has %d values and out %d, want %d tokens × %d", len(x), len(out), T, H)
	}
	if cache.Dim() != L {
		return fmt.Errorf("dpattn: attention: cache rows have %d values, the block's latent %d", cache.Dim(), L)
	}
	if T == 0 {
		return nil
	}
	seen := make(map[int]bool, T)
	for _, s := range seqs {
		if seen[s] {
			return fmt.Errorf("dpattn: attention: sequence %d has two tokens in one decode step", s)
		}
		seen[s] = true
	}
	rows := make([]int32, T)
	for t := range rows {
		rows[t] = int32(t)
	}
	q := make([]float32, T*a.Heads*L)
	kv := make([]float32, T*L)
	if err := kernels.Parallel(ctx, workers, 2, func(i int) {
		if i == 0 {
			kernels.GEMMRows(q, x, rows, a.Wq, nil, 0, a.Wq.Rows)
		} else {
			kernels.GEMMRows(kv, x, rows, a.Wkv, nil, 0, a.Wkv.Rows)
		}
	}); err != nil {
		return err
	}
	queries := make([]Query, T)
	for t, s := range seqs {
		if err := cache.Append(s, kv[t*L:(t+1)*L]); err != nil {
			return err
		}
		queries[t] = Query{Table: cache.BlockTable(s), Len: cache.Len(s)}
	}
	o := make([]float32, T*a.Heads*a.DV)
	if err := MLA(ctx, cache, q, queries, a.Heads, a.DV, a.Scale, o, nil, Options{Workers: workers}); err != nil {
		return err
	}
	kernels.GEMMRows(out, o, rows, a.Wo, nil, 0, a.Wo.Rows)
	return nil
}
