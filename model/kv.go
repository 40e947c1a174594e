package model

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/internal/memlimit"
	"github.com/moex-project/moex/kernels"
)

// KV is the latent caches of a model's sequences: one paged cache a layer,
// every layer's holding the same sequences at the same lengths (so they
// fill and free in step).
type KV struct {
	caches []*attn.Cache
}

// NewKV makes the caches of blocks blocks of blockRows rows each, per layer,
// in dtype (F32 or BF16).
func (m *Model) NewKV(blocks, blockRows int, dtype kernels.DType) (*KV, error) {
	kv := &KV{}
	for _, d := range m.layers {
		c, err := attn.NewCache(blocks, blockRows, d.attn.RowDim(), dtype)
		if err != nil {
			return nil, err
		}
		kv.caches = append(kv.caches, c)
	}
	return kv, nil
}

// Len is the tokens sequence seq holds.
func (kv *KV) Len(seq int) int { return kv.caches[0].Len(seq) }

// FreeBlocks is the blocks a layer's cache has free (every layer's alike).
func (kv *KV) FreeBlocks() int { return kv.caches[0].FreeBlocks() }

// BlockSize is the rows a block holds.
func (kv *KV) BlockSize() int { return kv.caches[0].BlockSize() }

// NumBlocks is the blocks a layer's cache holds.
func (kv *KV) NumBlocks() int { return kv.caches[0].NumBlocks() }

// Free drops sequence seq from every layer's cache.
func (kv *KV) Free(seq int) error {
	for _, c := range kv.caches {
		if err := c.Free(seq); err != nil {
			return err
		}
	}
	return nil
}

// Blocks is a run of whole cache blocks in every layer's cache (the same
// tokens' rows in each), held by a Share reference until Released: what a
// prefix cache keeps.
type Blocks struct {
	layers [][]int32
}

// Len is the blocks of the run (in each layer).
func (b Blocks) Len() int {
	if len(b.layers) == 0 {
		return 0
	}
	return len(b.layers[0])
}

// Slice is blocks [i, j) of the run, sharing its references.
func (b Blocks) Slice(i, j int) Blocks {
	out := Blocks{layers: make([][]int32, len(b.layers))}
	for l, bl := range b.layers {
		out.layers[l] = bl[i:j:j]
	}
	return out
}

// Share takes a reference on blocks [from, to) of sequence seq in every
// layer, which must be whole: they outlive the sequence until Released.
func (kv *KV) Share(seq, from, to int) (Blocks, error) {
	b := Blocks{layers: make([][]int32, len(kv.caches))}
	for l, c := range kv.caches {
		bl, err := c.Share(seq, from, to)
		if err != nil {
			kv.Release(Blocks{layers: b.layers[:l]})
			return Blocks{}, fmt.Errorf("model: layer %d: %w", l, err)
		}
		b.layers[l] = bl
	}
	return b, nil
}

// Attach makes sequence seq, not in the caches, start with the runs'
// blocks in order (their rows its first tokens), taking a reference on
// each; its later tokens go to blocks of its own.
func (kv *KV) Attach(seq int, runs ...Blocks) error {
	for l, c := range kv.caches {
		var table []int32
		for _, r := range runs {
			if len(r.layers) != len(kv.caches) {
				return fmt.Errorf("model: attaching a run of %d layers to caches of %d", len(r.layers), len(kv.caches))
			}
			table = append(table, r.layers[l]...)
		}
		if err := c.Attach(seq, table); err != nil {
			for _, done := range kv.caches[:l] {
				done.Free(seq)
			}
			return fmt.Errorf("model: layer %d: %w", l, err)
		}
	}
	return nil
}

// Release drops b's references; blocks no sequence holds are free.
func (kv *KV) Release(b Blocks) error {
	for l, bl := range b.layers {
		if err := kv.caches[l].Release(bl); err != nil {
			return fmt.Errorf("model: layer %d: %w", l, err)
		}
	}
	return nil
}

// truncate takes every layer's cache of each sequence back to lens.
func (kv *KV) truncate(lens map[int]int) {
	// In one order for every layer, so that their free lists stay alike.
	seqs := slices.Sorted(maps.Keys(lens))
	for _, c := range kv.caches {
		for _, s := range seqs {
			if n := lens[s]; c.Len(s) > n {
				c.Truncate(s, n) // to nothing: the sequence is removed
			}
		}
	}
}

// Forward runs tokens ids, token t of sequence seqs[t], through the model:
// a sequence's tokens in ids are consecutive positions after what kv holds
// for it (a prompt's chunk, or one decode token). It returns the logits of
// the tokens rows lists ([len(rows), vocab]; nil rows: every token). Either
// every layer's cache takes the tokens' rows, or (on an error, such as
// attn.ErrCacheExhausted when the blocks would not suffice, checked
// before any work) none does. A token's logits do not depend on the other
// sequences in the call.
func (m *Model) Forward(ctx context.Context, kv *KV, seqs []int, ids []int32, rows []int) ([]float32, error) {
	rows, lens, err := m.check(kv, seqs, ids, rows)
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	return m.run(ctx, kv, seqs, ids, rows, lens, func(ctx context.Context, l int, x, y []float32) error {
		return m.layers[l].moe.Forward(ctx, x, y)
	})
}

// check refuses a call Forward cannot run, before any work: its sizes,
// ids, rows (nil: every token), the blocks it needs and the memory it
// allocates. It returns the rows and each sequence's length before the
// call.
func (m *Model) check(kv *KV, seqs []int, ids []int32, rows []int) ([]int, map[int]int, error) {
	T, H := len(ids), m.Hidden
	if len(seqs) != T {
		return nil, nil, fmt.Errorf("model: %d token ids for %d sequence entries", T, len(seqs))
	}
	if len(kv.caches) != len(m.layers) {
		return nil, nil, fmt.Errorf("model: a KV of %d layers for a model of %d", len(kv.caches), len(m.layers))
	}
	for i, id := range ids {
		if id < 0 || int(id) >= m.Vocab {
			return nil, nil, fmt.Errorf("model: token %d is id %d, outside the vocabulary [0, %d)", i, id, m.Vocab)
		}
	}
	if rows == nil {
		rows = make([]int, T)
		for t := range rows {
			rows[t] = t
		}
	}
	for _, r := range rows {
		if r < 0 || r >= T {
			return nil, nil, fmt.Errorf("model: logits row %d of a call of %d tokens", r, T)
		}
	}
	// The blocks every sequence grows by, the same in every layer.
	lens, grow := map[int]int{}, map[int]int{}
	for _, s := range seqs {
		if _, ok := lens[s]; !ok {
			lens[s] = kv.Len(s)
		}
		grow[s]++
	}
	bs, need := kv.BlockSize(), 0
	for s, n := range grow {
		need += (lens[s]+n+bs-1)/bs - (lens[s]+bs-1)/bs
	}
	if free := kv.FreeBlocks(); need > free {
		return nil, nil, errkind.Errorf(attn.ErrCacheExhausted, "model: the step needs %d more cache blocks, %d of %d are free", need, free, kv.NumBlocks())
	}
	// What the call allocates: activations, each layer's queries and
	// latent rows, the logits asked for; checked before any of it.
	lat := 0
	if len(m.layers) > 0 {
		lat = m.layers[0].attn.RowDim()
	}
	bytes := 4 * (float64(T)*float64(6*H+8*lat+4*m.Config.TopK) + float64(len(rows))*float64(m.Vocab))
	if err := memlimit.Check(fmt.Sprintf("model: a step of %d tokens (%d logits rows of %d)", T, len(rows), m.Vocab), bytes); err != nil {
		return nil, nil, err
	}
	return rows, lens, nil
}

// StepTimes accumulates the wall time of forward passes' parts, for
// benchmarks (Model.TimeSteps): the attention blocks (projections,
// attention, output projection), the MLPs (MoE or dense, with the norm
// before them) and the final norm and output projection.
type StepTimes struct {
	Attention, MLP, Head atomic.Int64 // nanoseconds
}

// TimeSteps makes later forward passes add their parts' times to t (nil:
// stop). Concurrent passes add theirs too. Set it before the passes.
func (m *Model) TimeSteps(t *StepTimes) { m.times = t }

// now is the time when timing is on (d not nil), else zero: no clock
// read on a step nobody times.
func now(d *atomic.Int64) time.Time {
	if d == nil {
		return time.Time{}
	}
	return time.Now()
}

// since adds the time since t0 to *d when timing is on.
func since(d *atomic.Int64, t0 time.Time) {
	if d != nil {
		d.Add(int64(time.Since(t0)))
	}
}

// moeFunc computes MoE layer l's output y for its input x (rows of
// Hidden), on this process or across ranks.
type moeFunc func(ctx context.Context, l int, x, y []float32) error

// run is Forward's work once check has passed, each MoE layer through
// moe. With no tokens it only calls moe, with empty rows, for every MoE
// layer (a data-parallel rank's IDLE batch).
func (m *Model) run(ctx context.Context, kv *KV, seqs []int, ids []int32, rows []int, lens map[int]int, moe moeFunc) ([]float32, error) {
	T, H := len(ids), m.Hidden
	x := make([]float32, T*H)
	for t, id := range ids {
		m.embed.RowF32(int(id), x[t*H:(t+1)*H])
	}
	normed := make([]float32, T*H)
	y := make([]float32, T*H)
	var tAttn, tMLP, tHead *atomic.Int64
	if t := m.times; t != nil {
		tAttn, tMLP, tHead = &t.Attention, &t.MLP, &t.Head
	}
	for l, d := range m.layers {
		err := ctx.Err()
		t0 := now(tAttn)
		if err == nil && T > 0 {
			kernels.RMSNorm(normed, x, d.inNorm, m.eps)
			if err = d.attn.ForwardWith(ctx, m.backend, kv.caches[l], seqs, normed, y); err != nil {
				err = fmt.Errorf("model: layer %d attention: %w", l, err)
			}
			since(tAttn, t0)
			t0 = now(tMLP)
			if err == nil {
				add(x, y)
				kernels.RMSNorm(normed, x, d.postNorm, m.eps)
			}
		}
		if err == nil {
			if d.moe != nil {
				err = moe(ctx, l, normed, y)
			} else if T > 0 {
				err = m.denseMLP(ctx, d.dense, normed, y)
			}
			if err != nil {
				err = fmt.Errorf("model: layer %d MLP: %w", l, err)
			}
			since(tMLP, t0)
		}
		if err != nil {
			kv.truncate(lens)
			return nil, err
		}
		add(x, y)
	}
	if T == 0 {
		return nil, nil
	}
	// The rows asked for, normed into normed's first rows, through lm_head.
	defer since(tHead, now(tHead))
	sel := make([]int32, len(rows))
	for i, r := range rows {
		sel[i] = int32(i)
		kernels.RMSNorm(normed[i*H:(i+1)*H], x[r*H:(r+1)*H], m.norm, m.eps)
	}
	logits := make([]float32, len(rows)*m.Vocab)
	if err := kernels.GroupedGEMM(ctx, 0, normed[:len(rows)*H], []kernels.GEMMGroup{{B: m.lmHead, Rows: sel, Out: logits}}); err != nil {
		kv.truncate(lens)
		return nil, err
	}
	if i := kernels.NonFinite(logits); i >= 0 {
		kv.truncate(lens)
		return nil, fmt.Errorf("model: logit %d of token %d is %v", i%m.Vocab, rows[i/m.Vocab], logits[i])
	}
	return logits, nil
}
