package attn

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/internal/buffers"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// GQAConfig is a grouped-query attention block: its shapes and what the
// family adds around the attention (biases, QK norms, sinks, a window,
// RoPE over part of each head).
type GQAConfig struct {
	Hidden, Heads, KVHeads, HeadDim int
	// Bias: q, k and v have biases; OutBias: o_proj has one.
	Bias, OutBias bool
	QKNorm        arch.QKNorm
	NormEps       float64 // the QK norms' epsilon
	Sinks         bool
	Window        int          // 0: none
	RoPE          kernels.RoPE // over the first RoPE.Dim() values of each head
	// Scale is the softmax scale: 1/√HeadDim.
	Scale float32
}

// GQAConfigOf is layer n's attention as a's family defines it; an error
// names what is missing or out of range.
func GQAConfigOf(a *arch.Config, n int) (GQAConfig, error) {
	at := a.Attention
	if at.Kind != arch.GQA {
		return GQAConfig{}, fmt.Errorf("attn: model_type %q: its attention is %v, not grouped-query", a.Name, at.Kind)
	}
	if err := a.WholeModel(); err != nil {
		return GQAConfig{}, err
	}
	var s kernels.RoPEScaling
	if y := at.RoPE.Scaling; y != nil {
		s = kernels.RoPEScaling{Type: y.Type, Factor: y.Factor, OrigMaxPos: y.OrigMaxPos, BetaFast: y.BetaFast, BetaSlow: y.BetaSlow,
			MScale: y.MScale, MScaleAllDim: y.MScaleAllDm, NoTruncate: y.Truncate != nil && !*y.Truncate,
			LowFreqFactor: y.LowFreqFactor, HighFreqFactor: y.HighFreqFactor}
		if y.AttentionFactor != nil {
			s.AttentionFactor = *y.AttentionFactor
		}
	}
	style := kernels.RoPEHalves
	if at.RoPEPairs {
		style = kernels.RoPEPairs
	}
	r, sm, err := kernels.NewRoPE(at.RotaryDim, at.RoPE.Theta, s, style)
	if err != nil {
		return GQAConfig{}, fmt.Errorf("attn: model_type %q: %w", a.Name, err)
	}
	return GQAConfig{Hidden: a.Hidden, Heads: at.Heads, KVHeads: at.KVHeads, HeadDim: at.HeadDim, Bias: at.Bias, OutBias: at.OutBias,
		QKNorm: at.QKNorm, NormEps: a.NormEps, Sinks: at.Sinks, Window: at.LayerWindow(n), RoPE: r,
		Scale: float32(1 / math.Sqrt(float64(at.HeadDim)) * sm)}, nil
}

// GQABlock is grouped-query attention with its projections, as
// transformers' Llama-family attention computes it: q, k, v = x·Wᵀ (+ b),
// the QK norms, RoPE on the rotated part of every head, attention over the
// cache (a token's keys and values appended as one row), o_proj.
type GQABlock struct {
	Cfg GQAConfig

	q, k, v, o     kernels.Matrix // [heads·d, hidden], [kv·d, hidden] twice, [hidden, heads·d]
	qb, kb, vb, ob []float32      // biases, nil without
	qNorm, kNorm   []float32      // [d] (QKNormHead) or [heads·d], [kv·d] (QKNormWhole)
	sinks          []float32      // [heads]
}

// TensorSource is a tensor of a model by name and PyTorch shape (moe's
// Checkpoint.Matrix, gguf's Model.Matrix).
type TensorSource func(name string, shape ...int) (kernels.Matrix, error)

// LoadGQABlock reads layer n's attention from get under names.
func LoadGQABlock(get TensorSource, a *arch.Config, names arch.LayerNames, n int) (*GQABlock, error) {
	cfg, err := GQAConfigOf(a, n)
	if err != nil {
		return nil, err
	}
	return newGQABlock(get, cfg, names)
}

// NewRandomGQABlock makes a block of cfg with random weights in dtype (as
// NewRandomMLABlock's; sinks in 1 ± 0.2), the same for the same seed.
func NewRandomGQABlock(cfg GQAConfig, dtype kernels.DType, seed uint64) (*GQABlock, error) {
	if cfg.Hidden < 1 || cfg.Heads < 1 || cfg.KVHeads < 1 || cfg.Heads%cfg.KVHeads != 0 || cfg.HeadDim < 2 || cfg.RoPE.Dim() > cfg.HeadDim {
		return nil, fmt.Errorf("attn: random grouped-query attention of %+v", cfg)
	}
	return newGQABlock(randomSource(dtype, seed), cfg, arch.LayerNames{Q: "q_proj.weight", K: "k_proj.weight", V: "v_proj.weight",
		O: "o_proj.weight", QNorm: "q_norm.weight", KNorm: "k_norm.weight", Sinks: "sinks"})
}

func newGQABlock(get TensorSource, cfg GQAConfig, names arch.LayerNames) (*GQABlock, error) {
	var err error
	H, nh, kv, d := cfg.Hidden, cfg.Heads, cfg.KVHeads, cfg.HeadDim
	b := &GQABlock{Cfg: cfg}
	bias := func(w string) string { return strings.TrimSuffix(w, ".weight") + ".bias" }
	vec := func(name string, n int) ([]float32, error) {
		m, err := get(name, n)
		if err != nil {
			return nil, err
		}
		v := make([]float32, n)
		m.RowF32(0, v)
		if err := moe.CheckFinite(v, n); err != nil {
			return nil, fmt.Errorf("attn: tensor %q: %w", name, err)
		}
		return v, nil
	}
	for _, p := range []struct {
		m          *kernels.Matrix
		b          *[]float32
		name       string
		rows, cols int
		withBias   bool
	}{{&b.q, &b.qb, names.Q, nh * d, H, cfg.Bias}, {&b.k, &b.kb, names.K, kv * d, H, cfg.Bias},
		{&b.v, &b.vb, names.V, kv * d, H, cfg.Bias}, {&b.o, &b.ob, names.O, H, nh * d, cfg.OutBias}} {
		if *p.m, err = get(p.name, p.rows, p.cols); err != nil {
			return nil, err
		}
		if p.withBias {
			if *p.b, err = vec(bias(p.name), p.rows); err != nil {
				return nil, err
			}
		}
	}
	switch cfg.QKNorm {
	case arch.QKNormHead:
		if b.qNorm, err = vec(names.QNorm, d); err == nil {
			b.kNorm, err = vec(names.KNorm, d)
		}
	case arch.QKNormWhole:
		if b.qNorm, err = vec(names.QNorm, nh*d); err == nil {
			b.kNorm, err = vec(names.KNorm, kv*d)
		}
	}
	if err != nil {
		return nil, err
	}
	if cfg.Sinks {
		if b.sinks, err = vec(names.Sinks, nh); err != nil {
			return nil, err
		}
	}
	if kernels.PacksWeights() {
		b.q, b.k, b.v, b.o = kernels.Pack(b.q), kernels.Pack(b.k), kernels.Pack(b.v), kernels.Pack(b.o)
	}
	return b, nil
}

// HiddenSize is the model width.
func (b *GQABlock) HiddenSize() int { return b.Cfg.Hidden }

// SetNumerics puts q, k, v and o in mode n where their dtypes can take it.
func (b *GQABlock) SetNumerics(n kernels.Numerics) int {
	return setNumerics(n, &b.q, &b.k, &b.v, &b.o)
}

// RowDim is a token's cache row: its keys, then its values.
func (b *GQABlock) RowDim() int { return 2 * b.Cfg.KVHeads * b.Cfg.HeadDim }

// WeightBytes is the bytes of the block's projection weights in their
// stored dtypes: what a step reads of them.
func (b *GQABlock) WeightBytes() int64 {
	return b.q.Bytes() + b.k.Bytes() + b.v.Bytes() + b.o.Bytes()
}

// Close releases nothing: the block's weights are its model's.
func (b *GQABlock) Close() error { return nil }

// Forward runs new tokens x [T, hidden] of sequences seqs (a sequence's
// tokens consecutive, in order, after what the cache holds), appending
// their keys and values to the cache, and writes out [T, hidden].
func (b *GQABlock) Forward(ctx context.Context, cache *Cache, seqs []int, x, out []float32) error {
	return b.ForwardWith(ctx, Backend{}, cache, seqs, x, out)
}

type gqaScratch struct{ q, k, v, o []float32 }

var gqaPool = sync.Pool{New: func() any { return new(gqaScratch) }}

// ForwardWith is Forward with the projections and the attention on be.
func (b *GQABlock) ForwardWith(ctx context.Context, be Backend, cache *Cache, seqs []int, x, out []float32) error {
	c := b.Cfg
	T, H, nh, kvh, d := len(seqs), c.Hidden, c.Heads, c.KVHeads, c.HeadDim
	if len(x) != T*H || len(out) != T*H {
		return fmt.Errorf("attn: gqa block: x has %d values and out %d, want %d tokens × %d", len(x), len(out), T, H)
	}
	if cache.Dim() != b.RowDim() {
		return fmt.Errorf("attn: gqa block: cache rows have %d values, want 2 × %d key/value heads × %d", cache.Dim(), kvh, d)
	}
	if err := moe.CheckFinite(x, H); err != nil {
		return err
	}
	if T == 0 {
		return nil
	}
	proj := be.projector()
	sc := gqaPool.Get().(*gqaScratch)
	defer gqaPool.Put(sc)
	q := buffers.Grow(&sc.q, T*nh*d)
	k := buffers.Grow(&sc.k, T*kvh*d)
	v := buffers.Grow(&sc.v, T*kvh*d)
	if err := projectAll(ctx, proj, []*kernels.Matrix{&b.q, &b.k, &b.v}, x, [][]float32{q, k, v}); err != nil {
		return err
	}
	addBias(q, b.qb)
	addBias(k, b.kb)
	addBias(v, b.vb)
	if c.QKNorm != arch.NoQKNorm { // a weight of one head (every head alike) or of all of a token's
		kernels.RMSNormThenWeight(q, q, b.qNorm, c.NormEps)
		kernels.RMSNormThenWeight(k, k, b.kNorm, c.NormEps)
	}
	queries := make([]Query, T)
	row := make([]float32, b.RowDim())
	for t, s := range seqs {
		pos := cache.Len(s)
		c.RoPE.ApplyHeads(q[t*nh*d:(t+1)*nh*d], nh, d, pos)
		c.RoPE.ApplyHeads(k[t*kvh*d:(t+1)*kvh*d], kvh, d, pos)
		copy(row, k[t*kvh*d:(t+1)*kvh*d])
		copy(row[kvh*d:], v[t*kvh*d:(t+1)*kvh*d])
		if err := cache.Append(s, row); err != nil {
			return err
		}
		queries[t] = Query{Len: pos + 1}
	}
	setTables(cache, seqs, queries)
	o := buffers.Grow(&sc.o, T*nh*d)
	p := GQAParams{Heads: nh, KVHeads: kvh, KeyDim: d, ValueDim: d, Scale: c.Scale, Window: c.Window, Sinks: b.sinks}
	attend := func() error { return GQA(ctx, cache, q, queries, p, o) }
	if be.Core != nil {
		attend = func() error { return be.Core.AttendGQA(ctx, cache, q, queries, p, o) }
	}
	if err := attend(); err != nil {
		return err
	}
	if err := proj.Project(ctx, &b.o, o, out); err != nil {
		return err
	}
	addBias(out, b.ob)
	return nil
}

// addBias adds b to every row of x (nothing when b is nil).
func addBias(x, b []float32) {
	if b == nil {
		return
	}
	for r := 0; r < len(x); r += len(b) {
		for i, v := range b {
			x[r+i] += v
		}
	}
}
