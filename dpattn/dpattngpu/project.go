//go:build cuda || cudaemu

package dpattngpu

import (
	"context"
	"fmt"
	"sync"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/kernels"
)

// projector computes an attention block's projections on a device
// (attn.Projector): each weight matrix, or each stack of per-head
// matrices, is uploaded as bf16 on first use and kept there by the address
// the block holds it at; activations are rounded to bf16 on the device
// (tensor-core numerics) and the grouped GEMM runs with one group per
// head. Safe for concurrent use.
type projector struct {
	d       cuda.Launcher
	mu      sync.Mutex
	weights map[*kernels.Matrix]resident
	bs      *cuda.Buffers
	tmp     *cuda.ScratchPool // each call's inputs, layout and outputs
}

var _ attn.Projector = (*projector)(nil)

// resident is a weight stack on the device and its shape.
type resident struct {
	buf               cuda.Buffer
	heads, rows, cols int
}

// Projections returns the device's projector of attention blocks, shared
// by every cache that uses this core (set it as the caches' Proj).
func (a *Attention) Projections() attn.Projector {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proj == nil {
		a.proj = &projector{d: a.d, weights: map[*kernels.Matrix]resident{}, bs: cuda.NewBuffers(a.d), tmp: cuda.NewScratchPool(a.d)}
	}
	return a.proj
}

func (p *projector) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bs.Free()
	p.tmp.Free()
	clear(p.weights)
}

func (p *projector) Project(ctx context.Context, w *kernels.Matrix, x, out []float32) error {
	return p.run(ctx, "projection", []kernels.Matrix{*w}, w, x, out)
}

func (p *projector) ProjectHeads(ctx context.Context, ws []kernels.Matrix, x, out []float32) error {
	if len(ws) == 0 {
		return fmt.Errorf("cuda: head projection: no heads")
	}
	return p.run(ctx, "head projection", ws, &ws[0], x, out)
}

// stack returns the device copy of ws ([heads, n, k] bf16), kept under key.
func (p *projector) stack(key *kernels.Matrix, ws []kernels.Matrix) (cuda.Buffer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	want := resident{heads: len(ws), rows: ws[0].Rows, cols: ws[0].Cols}
	if r, ok := p.weights[key]; ok {
		if r.heads != want.heads || r.rows != want.rows || r.cols != want.cols {
			return cuda.Buffer{}, fmt.Errorf("cuda: the weights at %p are on the device as %d × [%d, %d], asked for as %d × [%d, %d]",
				key, r.heads, r.rows, r.cols, want.heads, want.rows, want.cols)
		}
		return r.buf, nil
	}
	var rows []uint16
	for _, w := range ws {
		rows = append(rows, cuda.BF16Rows(w)...)
	}
	b, err := cuda.Upload(p.d, rows)
	p.bs.Put(b, err)
	if err != nil {
		return cuda.Buffer{}, fmt.Errorf("cuda: uploading a [%d, %d, %d] projection: %w", len(ws), ws[0].Rows, ws[0].Cols, err)
	}
	want.buf = b
	p.weights[key] = want
	return b, nil
}

// run computes out[r] = x[r] · ws[r % heads]ᵀ: the rows of each head in a
// block range of their own (the layout built here), one grouped GEMM.
func (p *projector) run(ctx context.Context, what string, ws []kernels.Matrix, key *kernels.Matrix, x, out []float32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	heads := len(ws)
	N, K := ws[0].Rows, ws[0].Cols
	for h, w := range ws {
		if w.Rows != N || w.Cols != K {
			return fmt.Errorf("cuda: %s: head %d is [%d, %d], head 0 [%d, %d]", what, h, w.Rows, w.Cols, N, K)
		}
	}
	if K == 0 || K%16 != 0 || N == 0 {
		return fmt.Errorf("cuda: %s: [%d, %d] weights; the device GEMM takes k a positive multiple of 16", what, N, K)
	}
	rows := len(x) / K
	if len(x) != rows*K || rows%heads != 0 || len(out) != rows*N {
		return fmt.Errorf("cuda: %s: x has %d values and out %d, want rows of %d and %d, a multiple of %d rows",
			what, len(x), len(out), K, N, heads)
	}
	if rows == 0 {
		return nil
	}
	w, err := p.stack(key, ws)
	if err != nil {
		return err
	}
	T := rows / heads
	per := (T + cuda.GEMMBlock - 1) / cuda.GEMMBlock // blocks per head
	padded := heads * per * cuda.GEMMBlock
	sorted := make([]int32, padded)
	blockExpert := make([]int32, heads*per)
	for h := 0; h < heads; h++ {
		for i := 0; i < per*cuda.GEMMBlock; i++ {
			sorted[h*per*cuda.GEMMBlock+i] = int32(rows) // past the rows: padding
			if i < T {
				sorted[h*per*cuda.GEMMBlock+i] = int32(i*heads + h)
			}
		}
		for b := 0; b < per; b++ {
			blockExpert[h*per+b] = int32(h)
		}
	}
	sc := p.tmp.Get()
	defer p.tmp.Put(sc)
	var buf [5]cuda.Buffer
	for i, bytes := range []int64{int64(len(x) * 4), int64(len(sorted) * 4), int64(len(blockExpert) * 4), int64(rows * K * 2),
		int64(padded * N * 4)} {
		if buf[i], err = sc.At(i, bytes); err != nil {
			return err
		}
	}
	xf, sb, be, xb, c := buf[0], buf[1], buf[2], buf[3], buf[4]
	cs := make([]float32, padded*N)
	for _, f := range []func() error{
		func() error { return cuda.CopyIn(p.d, xf, x) },
		func() error { return cuda.CopyIn(p.d, sb, sorted) },
		func() error { return cuda.CopyIn(p.d, be, blockExpert) },
		func() error { return p.d.F32ToBF16(xf, xb, rows*K) },
		func() error {
			return p.d.GroupedGEMM(cuda.GEMMArgs{A: xb, Epilogue: cuda.Epilogue{}, Sorted: sb, BlockExpert: be, PaddedRows: padded, TopK: 1, Pairs: rows, GatherA: true, N: N, K: K}, cuda.BF16Weights(w), cuda.Buffer{}, c)
		},
		func() error { return cuda.Download(p.d, c, cs) },
	} {
		if err := f(); err != nil {
			return err
		}
	}
	for h := 0; h < heads; h++ {
		for t := 0; t < T; t++ {
			src := (h*per*cuda.GEMMBlock + t) * N
			copy(out[(t*heads+h)*N:(t*heads+h+1)*N], cs[src:src+N])
		}
	}
	return nil
}
