package attn

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sync"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/format/gguf"
	"github.com/moex-project/moex/internal/buffers"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// MLAConfig is the attention part of a DeepSeek-V2/V3 config.json.
type MLAConfig struct {
	Hidden     int
	Heads      int
	QLoraRank  *int // nil: a plain q_proj
	KVLoraRank int
	NopeDim    int
	RopeDim    int
	VDim       int
	RopeTheta  float64
	RMSNormEps float64
	Bias       bool
	Scaling    *YarnScaling
}

// YarnScaling is config.json's rope_scaling (only "yarn" changes anything).
type YarnScaling = arch.RoPEScaling

// MLAConfig is the MLA attention of a model's config (arch.Load), checked:
// an error names the file (where) and what is missing or out of range.
func MLAConfigOf(a *arch.Config, where string) (MLAConfig, error) {
	at := a.Attention
	if at.Kind != arch.MLA {
		return MLAConfig{}, fmt.Errorf("attn: %s (model_type %q) has no kv_lora_rank: MLA attention (DeepSeek-V2/V3's) needs it, and other families have none", where, a.Name)
	}
	for _, key := range a.Missing {
		switch key {
		case "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim":
			return MLAConfig{}, fmt.Errorf("attn: %s: %s is missing", where, key)
		}
	}
	cfg := MLAConfig{Hidden: a.Hidden, Heads: at.Heads, QLoraRank: at.QLoraRank, KVLoraRank: at.KVLoraRank, NopeDim: at.NopeDim,
		RopeDim: at.RopeDim, VDim: at.VDim, RopeTheta: at.RoPE.Theta, RMSNormEps: a.NormEps, Bias: at.Bias, Scaling: at.RoPE.Scaling}
	for _, f := range []struct {
		name string
		v    int
	}{{"hidden_size", cfg.Hidden}, {"num_attention_heads", cfg.Heads}, {"kv_lora_rank", cfg.KVLoraRank},
		{"qk_nope_head_dim", cfg.NopeDim}, {"qk_rope_head_dim", cfg.RopeDim}, {"v_head_dim", cfg.VDim}} {
		if f.v <= 0 {
			return MLAConfig{}, fmt.Errorf("attn: %s: %s is %d, must be positive", where, f.name, f.v)
		}
	}
	if cfg.RopeDim%2 != 0 {
		return MLAConfig{}, fmt.Errorf("attn: qk_rope_head_dim %d must be even", cfg.RopeDim)
	}
	if cfg.Bias {
		return MLAConfig{}, fmt.Errorf("attn: attention_bias is true: attention biases are not supported")
	}
	return cfg, nil
}

// MLABlock is a DeepSeek-V2/V3 attention block run in MLA's absorbed form:
// the query's no-RoPE part is folded through kv_b_proj's key half into the
// latent space, attention runs over the cached latents [kv_a_layernorm(c),
// RoPE(k_pe)], and the value half of kv_b_proj lifts each head's latent
// output before o_proj.
type MLABlock struct {
	Cfg   MLAConfig
	Scale float32 // softmax scale, yarn's mscale² included

	qProj, qA, qB kernels.Matrix // q_proj, or q_a_proj and q_b_proj
	qANorm        []float32
	kvA           kernels.Matrix   // [kv_lora_rank + rope, hidden]
	kvANorm       []float32        // [kv_lora_rank]
	wUKT          []kernels.Matrix // per head: key half of kv_b_proj, transposed [kv_lora_rank, nope]
	wUV           []kernels.Matrix // per head: value half of kv_b_proj [v_dim, kv_lora_rank]
	oProj         kernels.Matrix   // [hidden, heads·v_dim]
	rope          kernels.RoPE     // k_pe's and q_pe's: pairs in, halves out
	ck            *moe.Checkpoint
}

// MLAWeights are an MLA block's tensors as a device path takes them: the
// block's own (pointers into it, stable for its life, so a device can key
// its resident copies by them), not copies.
type MLAWeights struct {
	QProj     *kernels.Matrix // nil with a q_lora_rank: QA, its norm, then QB
	QA, QB    *kernels.Matrix
	QANorm    []float32
	KVA       *kernels.Matrix // [kv_lora_rank + rope, hidden]
	KVANorm   []float32       // [kv_lora_rank]
	WUKT, WUV []kernels.Matrix
	OProj     *kernels.Matrix
	RopeFreq  []float64 // rope/2 inverse frequencies (yarn's when configured), then the cos/sin scale
	Scale     float32   // the softmax scale
	Eps       float64   // the RMSNorm epsilon
}

// Weights returns the block's tensors for a device path.
func (b *MLABlock) Weights() MLAWeights {
	w := MLAWeights{KVA: &b.kvA, KVANorm: b.kvANorm, WUKT: b.wUKT, WUV: b.wUV, OProj: &b.oProj,
		RopeFreq: append(append([]float64(nil), b.rope.Freqs...), b.rope.Scale), Scale: b.Scale, Eps: b.Cfg.RMSNormEps}
	if b.Cfg.QLoraRank == nil {
		w.QProj = &b.qProj
	} else {
		w.QA, w.QB, w.QANorm = &b.qA, &b.qB, b.qANorm
	}
	return w
}

// LoadMLABlock maps layer n's self_attn tensors from a deepseek_v2 or
// deepseek_v3 checkpoint folder; the block owns the checkpoint it opens.
func LoadMLABlock(dir string, n int) (*MLABlock, error) {
	a, err := arch.Load(dir)
	if err != nil {
		return nil, err
	}
	if _, err := MLAConfigOf(a, filepath.Join(dir, "config.json")); err != nil {
		return nil, err
	}
	ck, err := moe.OpenCheckpointConfig(dir, a)
	if err != nil {
		return nil, err
	}
	b, err := LoadMLABlockFrom(ck, n)
	if err != nil {
		ck.Close()
		return nil, err
	}
	b.ck = ck
	return b, nil
}

// LoadMLABlockFrom is LoadMLABlock over a checkpoint already open (a whole
// model's, shared by its layers): the block refers to its mappings and
// does not close it.
func LoadMLABlockFrom(ck *moe.Checkpoint, n int) (*MLABlock, error) {
	cfg, err := MLAConfigOf(ck.Arch, filepath.Join(ck.Dir, "config.json"))
	if err != nil {
		return nil, err
	}
	a := ck.Arch
	return newMLABlock(mlaSource{get: ck.Matrix, has: ck.Has}, a.MLANames(a.Root(ck.Has), n), cfg)
}

// LoadMLABlockGGUF is layer n's MLA block from a GGUF model already open
// (a whole model's) with its config (moe.GGUFConfig): kv_b as one tensor
// (attn_kv_b) or split per head (attn_k_b, attn_v_b), as llama.cpp reads
// either; the block refers to the mappings.
func LoadMLABlockGGUF(g *gguf.Model, a *arch.Config, n int) (*MLABlock, error) {
	cfg, err := MLAConfigOf(a, g.Path())
	if err != nil {
		return nil, err
	}
	return newMLABlock(mlaSource{get: g.Matrix, has: g.Has, stacked: g.Stacked}, a.MLANames("", n), cfg)
}

// mlaSource is where an MLA block's tensors come from: get by name and
// shape; has, whether a name is there; stacked, a 3-D tensor [n, rows,
// cols] as n matrices (nil where the source has none).
type mlaSource struct {
	get     TensorSource
	has     func(name string) bool
	stacked func(name string, n, rows, cols int) ([]kernels.Matrix, error)
}

func newMLABlock(src mlaSource, names arch.MLANames, cfg MLAConfig) (*MLABlock, error) {
	get := src.get
	H, nh, qd := cfg.Hidden, cfg.Heads, cfg.NopeDim+cfg.RopeDim
	b := &MLABlock{Cfg: cfg}
	var err error
	vec := func(name string, n int) ([]float32, error) {
		m, err := get(name, n)
		if err != nil {
			return nil, err
		}
		v := make([]float32, n)
		m.RowF32(0, v)
		return v, nil
	}
	if cfg.QLoraRank == nil {
		if b.qProj, err = get(names.Q, nh*qd, H); err != nil {
			return nil, err
		}
	} else {
		r := *cfg.QLoraRank
		if b.qA, err = get(names.QA, r, H); err != nil {
			return nil, err
		}
		if b.qANorm, err = vec(names.QANorm, r); err != nil {
			return nil, err
		}
		if b.qB, err = get(names.QB, nh*qd, r); err != nil {
			return nil, err
		}
	}
	if b.kvA, err = get(names.KVA, cfg.KVLoraRank+cfg.RopeDim, H); err != nil {
		return nil, err
	}
	if b.kvANorm, err = vec(names.KVANorm, cfg.KVLoraRank); err != nil {
		return nil, err
	}
	L := cfg.KVLoraRank
	if names.KB != "" && src.stacked != nil && src.has != nil && !src.has(names.KVB) && src.has(names.KB) {
		// kv_b_proj stored split per head, the key half already transposed.
		if b.wUKT, err = src.stacked(names.KB, nh, L, cfg.NopeDim); err != nil {
			return nil, err
		}
		if b.wUV, err = src.stacked(names.VB, nh, cfg.VDim, L); err != nil {
			return nil, err
		}
	} else {
		kvB, err := get(names.KVB, nh*(cfg.NopeDim+cfg.VDim), L)
		if err != nil {
			return nil, err
		}
		// Split kv_b_proj per head: the key half transposed (absorbed into
		// the query), the value half as it is.
		row := make([]float32, L)
		for h := 0; h < nh; h++ {
			base := h * (cfg.NopeDim + cfg.VDim)
			kt := make([]float32, L*cfg.NopeDim)
			for j := 0; j < cfg.NopeDim; j++ {
				kvB.RowF32(base+j, row)
				for c, v := range row {
					kt[c*cfg.NopeDim+j] = v
				}
			}
			b.wUKT = append(b.wUKT, sameDType(kvB.DType, L, cfg.NopeDim, kt))
			vv := make([]float32, cfg.VDim*L)
			for j := 0; j < cfg.VDim; j++ {
				kvB.RowF32(base+cfg.NopeDim+j, vv[j*L:(j+1)*L])
			}
			b.wUV = append(b.wUV, sameDType(kvB.DType, cfg.VDim, L, vv))
		}
	}
	if b.oProj, err = get(names.O, H, nh*cfg.VDim); err != nil {
		return nil, err
	}
	b.pack()
	if err := b.setRoPE(); err != nil {
		return nil, err
	}
	return b, nil
}

// sameDType is the [rows, cols] matrix of values v, all exactly
// representable in dtype (they come from a matrix of it), stored in dtype:
// half the bytes of fp32 for bf16 and fp16 weights, the same values.
func sameDType(dtype kernels.DType, rows, cols int, v []float32) kernels.Matrix {
	var m kernels.Matrix
	switch dtype {
	case kernels.BF16, kernels.F16:
		conv := half.F32ToBF16
		if dtype == kernels.F16 {
			conv = half.F32ToF16
		}
		u := make([]uint16, len(v))
		for i, x := range v {
			u[i] = conv(x)
		}
		m, _ = kernels.NewHalf(dtype, rows, cols, u)
	default:
		m, _ = kernels.NewF32(rows, cols, v)
	}
	return m
}

// pack lays the projections out for the SIMD kernels where the machine has
// them, as moe.New does the experts' (see kernels.Pack).
func (b *MLABlock) pack() {
	if !kernels.PacksWeights() {
		return
	}
	for _, m := range []*kernels.Matrix{&b.qProj, &b.qA, &b.qB, &b.kvA, &b.oProj} {
		if m.Rows > 0 { // q_proj or the q_a/q_b pair is absent
			*m = kernels.Pack(*m)
		}
	}
	for h := range b.wUKT {
		b.wUKT[h], b.wUV[h] = kernels.Pack(b.wUKT[h]), kernels.Pack(b.wUV[h])
	}
}

// SetNumerics puts the checkpoint's projections (q_proj or q_a/q_b,
// kv_a, o_proj) in mode n where their dtypes can take it; the absorbed
// per-head halves of kv_b_proj stay exact.
func (b *MLABlock) SetNumerics(n kernels.Numerics) int {
	return setNumerics(n, &b.qProj, &b.qA, &b.qB, &b.kvA, &b.oProj)
}

// setRoPE sets the rotary embedding of k_pe and q_pe (yarn when the
// config says so) and the softmax scale (yarn's mscale² on it).
func (b *MLABlock) setRoPE() error {
	c := b.Cfg
	var s kernels.RoPEScaling
	if y := c.Scaling; y != nil {
		s = kernels.RoPEScaling{Type: y.Type, Factor: y.Factor, OrigMaxPos: y.OrigMaxPos, BetaFast: y.BetaFast, BetaSlow: y.BetaSlow,
			MScale: y.MScale, MScaleAllDim: y.MScaleAllDm}
	}
	r, sm, err := kernels.NewRoPE(c.RopeDim, c.RopeTheta, s, kernels.RoPEPairsToHalves)
	if err != nil {
		return fmt.Errorf("attn: %w", err)
	}
	b.rope = r
	b.Scale = float32(1 / math.Sqrt(float64(c.NopeDim+c.RopeDim)) * sm)
	return nil
}

// Close releases the checkpoint mapping, if any.
func (b *MLABlock) Close() error {
	if b.ck == nil {
		return nil
	}
	return b.ck.Close()
}

// DeepSeekV2LiteAttention is DeepSeek-V2-Lite's attention configuration.
func DeepSeekV2LiteAttention() MLAConfig {
	c := MLAConfig{Hidden: 2048, Heads: 16, KVLoraRank: 512, NopeDim: 128, RopeDim: 64, VDim: 128, RopeTheta: 10000, RMSNormEps: 1e-6}
	c.Scaling = &YarnScaling{Type: "yarn", Factor: 40, OrigMaxPos: 4096, BetaFast: 32, BetaSlow: 1, MScale: 0.707, MScaleAllDm: 0.707}
	return c
}

// NewRandomMLABlock makes an attention block of cfg with random weights in
// dtype (projections uniform in ±1/√fan_in, norm weights around one), the
// same for the same seed.
func NewRandomMLABlock(cfg MLAConfig, dtype kernels.DType, seed uint64) (*MLABlock, error) {
	for _, v := range []int{cfg.Hidden, cfg.Heads, cfg.KVLoraRank, cfg.NopeDim, cfg.RopeDim, cfg.VDim} {
		if v <= 0 {
			return nil, fmt.Errorf("attn: random attention with a non-positive size in %+v", cfg)
		}
	}
	if cfg.RopeDim%2 != 0 {
		return nil, fmt.Errorf("attn: qk_rope_head_dim %d must be even", cfg.RopeDim)
	}
	return newMLABlock(mlaSource{get: randomSource(dtype, seed)}, (&arch.Config{}).MLANames("model.", 0), cfg)
}

// HiddenSize is the model width.
func (b *MLABlock) HiddenSize() int { return b.Cfg.Hidden }

// matrices lists the block's projection weights.
func (b *MLABlock) matrices() []kernels.Matrix {
	ms := []kernels.Matrix{b.qProj, b.qA, b.qB, b.kvA, b.oProj}
	ms = append(ms, b.wUKT...)
	return append(ms, b.wUV...)
}

// WeightBytes is the bytes of the block's projection weights in their
// stored dtypes: what a step reads of them.
func (b *MLABlock) WeightBytes() int64 {
	var n int64
	for _, m := range b.matrices() {
		if m.Rows > 0 {
			n += m.Bytes()
		}
	}
	return n
}

// DecodeFLOPs is the floating-point work of a step of tokens queries, each
// attending over context cached rows: the projections, and per head the
// scores over kv_lora_rank + rope values and the weighted sum of
// kv_lora_rank.
func (b *MLABlock) DecodeFLOPs(tokens, context int) float64 {
	var params float64
	for _, m := range b.matrices() {
		params += float64(m.Rows) * float64(m.Cols)
	}
	c := b.Cfg
	attend := 2 * float64(c.Heads) * float64(context) * float64(2*c.KVLoraRank+c.RopeDim)
	return float64(tokens) * (2*params + attend)
}

// LatentDim is the cached row width: kv_lora_rank + qk_rope_head_dim.
func (b *MLABlock) RowDim() int { return b.Cfg.KVLoraRank + b.Cfg.RopeDim }

// Forward runs the block for new tokens x [T, hidden], token t of sequence
// seqs[t]; a sequence's tokens in x are consecutive positions, appended in
// order after what the cache holds (decode: one token each; extend:
// several). Each token's latent row goes into the cache and the token
// attends causally. out is [T, hidden].
func (b *MLABlock) Forward(ctx context.Context, cache *Cache, seqs []int, x, out []float32) error {
	return b.ForwardWith(ctx, Backend{}, cache, seqs, x, out)
}

// attnScratch is a forward pass's working memory, pooled as MLA's is
// (dpattn/mla.go): a decode step's buffers are reused, not fresh pages.
type attnScratch struct{ q, qa, kv, qNope, qLat, qAbs, o, v []float32 }

var attnPool = sync.Pool{New: func() any { return new(attnScratch) }}

// ForwardWith is Forward with its projections and attention on be.
func (b *MLABlock) ForwardWith(ctx context.Context, be Backend, cache *Cache, seqs []int, x, out []float32) error {
	c := b.Cfg
	T, H, nh := len(seqs), c.Hidden, c.Heads
	L, R, qd := c.KVLoraRank, c.RopeDim, c.NopeDim+c.RopeDim
	if len(x) != T*H || len(out) != T*H {
		return fmt.Errorf("attn: mla block: x has %d values and out %d, want %d tokens × %d", len(x), len(out), T, H)
	}
	if cache.Dim() != L+R {
		return fmt.Errorf("attn: mla block: cache rows have %d values, want kv_lora_rank + rope = %d", cache.Dim(), L+R)
	}
	if err := moe.CheckFinite(x, H); err != nil {
		return err
	}
	if T == 0 {
		return nil
	}
	proj := be.projector()
	sc := attnPool.Get().(*attnScratch)
	defer attnPool.Put(sc)
	q := buffers.Grow(&sc.q, T*nh*qd) // each of these written whole before it is read
	kv := buffers.Grow(&sc.kv, T*(L+R))
	if c.QLoraRank == nil { // q and the latent from x at once
		if err := projectAll(ctx, proj, []*kernels.Matrix{&b.qProj, &b.kvA}, x, [][]float32{q, kv}); err != nil {
			return err
		}
	} else {
		r := *c.QLoraRank
		qa := buffers.Grow(&sc.qa, T*r)
		if err := proj.Project(ctx, &b.qA, x, qa); err != nil {
			return err
		}
		for t := 0; t < T; t++ {
			row := qa[t*r : (t+1)*r]
			kernels.RMSNormThenWeight(row, row, b.qANorm, c.RMSNormEps)
		}
		if err := proj.Project(ctx, &b.qB, qa, q); err != nil {
			return err
		}
		if err := proj.Project(ctx, &b.kvA, x, kv); err != nil {
			return err
		}
	}
	// Cache rows and positions, in token order.
	queries := make([]Query, T)
	for t, s := range seqs {
		row := kv[t*(L+R) : (t+1)*(L+R)]
		kernels.RMSNormThenWeight(row[:L], row[:L], b.kvANorm, c.RMSNormEps)
		pos := cache.Len(s)
		b.rope.Apply(row[L:], pos)
		if err := cache.Append(s, row); err != nil {
			return err
		}
		queries[t] = Query{Len: pos + 1}
	}
	setTables(cache, seqs, queries)
	// Absorbed queries [T, heads, L+R]: the nope half through each head's
	// W_UKᵀ, the rope half rotated.
	qNope := buffers.Grow(&sc.qNope, T*nh*c.NopeDim)
	for th := 0; th < T*nh; th++ {
		copy(qNope[th*c.NopeDim:(th+1)*c.NopeDim], q[th*qd:th*qd+c.NopeDim])
	}
	qLat := buffers.Grow(&sc.qLat, T*nh*L)
	if err := proj.ProjectHeads(ctx, b.wUKT, qNope, qLat); err != nil {
		return err
	}
	qAbs := buffers.Grow(&sc.qAbs, T*nh*(L+R))
	for t := 0; t < T; t++ {
		pos := queries[t].Len - 1
		for h := 0; h < nh; h++ {
			th := t*nh + h
			dst := qAbs[th*(L+R) : (th+1)*(L+R)]
			copy(dst[:L], qLat[th*L:(th+1)*L])
			copy(dst[L:], q[th*qd+c.NopeDim:(th+1)*qd])
		}
		b.rope.ApplyHeads(qAbs[t*nh*(L+R)+L:(t+1)*nh*(L+R)], nh, L+R, pos)
	}
	o := buffers.Grow(&sc.o, T*nh*L)
	attend := func() error {
		return MLA(ctx, cache, qAbs, queries, MLAParams{Heads: nh, ValueDim: L, Scale: b.Scale}, o, nil)
	}
	if be.Core != nil {
		attend = func() error {
			return be.Core.Attend(ctx, cache, qAbs, queries, MLAParams{Heads: nh, ValueDim: L, Scale: b.Scale}, o)
		}
	}
	if err := attend(); err != nil {
		return err
	}
	v := buffers.Grow(&sc.v, T*nh*c.VDim)
	if err := proj.ProjectHeads(ctx, b.wUV, o, v); err != nil {
		return err
	}
	return proj.Project(ctx, &b.oProj, v, out)
}

// randomSource makes the weights a random block asks for: projections
// uniform in ±1/√fan_in in dtype (BF16 or F32), vectors (norms) 1 ± 0.2 in
// fp32, each tensor its own stream of seed.
func randomSource(dtype kernels.DType, seed uint64) TensorSource {
	stream := uint64(0)
	return func(name string, shape ...int) (kernels.Matrix, error) {
		stream++
		rng := rand.New(rand.NewPCG(seed, stream))
		rows, cols := 1, shape[len(shape)-1]
		if len(shape) == 2 {
			rows = shape[0]
		}
		norm := len(shape) == 1
		v := make([]float32, rows*cols)
		for i := range v {
			if norm {
				v[i] = float32(1 + 0.2*(2*rng.Float64()-1))
			} else {
				v[i] = float32((2*rng.Float64() - 1) / math.Sqrt(float64(cols)))
			}
		}
		if dtype == kernels.F32 || norm {
			return kernels.NewF32(rows, cols, v)
		}
		u := make([]uint16, len(v))
		for i, f := range v {
			u[i] = half.F32ToBF16(f)
		}
		return kernels.NewHalf(kernels.BF16, rows, cols, u)
	}
}
