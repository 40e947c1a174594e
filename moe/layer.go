// Package moe is the Mixture-of-Experts block of a transformer: model
// configs read from Hugging Face config.json files, checkpoints read from
// memory-mapped safetensors, gating for the families in Families, the
// dispatch layout, the grouped gated expert FFN and the combine step.
//
// A forward pass is gate → dispatch layout → grouped expert FFN → combine.
// Each token's output is the sum of its experts' weighted outputs in
// ascending expert id, then the shared expert: one fixed order, so a
// token's bits do not depend on the batch it is in or on the thread count.
// moe/moegpu runs the same pipeline on a device.
//
// The contract a serving process relies on:
//
//   - Concurrency: a Layer's Forward and ForwardRouting may be called from
//     many goroutines at once (each call takes reusable buffers of its own)
//     and give each caller the bits a serial call gives. SetWorkers,
//     SetNumerics, SetExpertRunner and Close wait for the calls in flight.
//   - Buffers: the caller owns x, y, ids and weights; a call reads x and
//     writes the others, and keeps none of them.
//   - Blocking calls take a context.Context first; a cancelled context
//     stops a forward pass between its stages with ctx.Err().
//   - Errors: bad input is an error, never a panic, of a class callers
//     branch on with errors.Is (ErrShape, ErrNonFinite, ErrMissingTensor,
//     ErrDenseLayer, ErrUnsupportedFormat, ErrUnknownFamily, ErrClosed); the
//     message names the tensor, token or layer.
//   - Close releases the checkpoint mapping once the forward passes in
//     flight are done; later ones return ErrClosed; a second Close does
//     nothing. (A Subset shares its parent's weights: close the parent
//     last.)
package moe

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/internal/buffers"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/internal/memlimit"
	"github.com/moex-project/moex/kernels"
)

// Expert is one gated MLP: down(act(gate·x, up·x)), SwiGLU
// (silu(gate·x) ⊙ up·x) unless the family says otherwise, plus the
// projections' biases where the family has them (gpt_oss).
type Expert struct {
	Gate, Up kernels.Matrix // [inter, hidden]
	Down     kernels.Matrix // [hidden, inter]
	// GateBias, UpBias [inter] and DownBias [hidden]; nil for none.
	GateBias, UpBias, DownBias []float32
}

// Weights are the tensors of one MoE block.
type Weights struct {
	Gate       kernels.Matrix  // [experts, hidden]
	Bias       []float32       // [experts]: e_score_correction_bias, NoAuxTC only
	RouterBias []float32       // [experts]: added to the logits, Config.RouterBias only
	Experts    []Expert        // [experts]
	Shared     *Expert         // the shared-expert MLP, or nil
	SharedGate *kernels.Matrix // [1, hidden]: qwen2_moe's shared_expert_gate, or nil

	// TokenExperts [vocab_size, top_k]: a hash layer's experts of each
	// token id (deepseek_v4's tid2eid); nil for a layer that chooses by
	// score.
	TokenExperts []int32
	// RouterScale [hidden] and ExpertScale [experts] are gemma4's
	// router.scale and per_expert_scale, Norms its block's norms
	// (Config.ResidualInput); nil for other families.
	RouterScale, ExpertScale []float32
	Norms                    *Norms
}

// Norms are the RMSNorm weights [hidden] of a block that owns its norms
// (gemma4): of the dense MLP's input (Pre) and output (Post1), of the
// experts' input (Pre2) and output (Post2), and of the block's output
// (Post).
type Norms struct {
	Pre, Post1, Pre2, Post2, Post []float32
}

// list is the norms with their checkpoint names' stems.
func (n *Norms) list() []struct {
	name string
	w    []float32
} {
	return []struct {
		name string
		w    []float32
	}{{"pre_feedforward_layernorm", n.Pre}, {"post_feedforward_layernorm_1", n.Post1}, {"pre_feedforward_layernorm_2", n.Pre2},
		{"post_feedforward_layernorm_2", n.Post2}, {"post_feedforward_layernorm", n.Post}}
}

// Layer is one MoE block, ready to run. Config and Router are shared with
// the layer's subsets and device runners: read them, never change them.
type Layer struct {
	Config *Config
	Router *Router
	// Arch is the whole model's config when the layer was loaded from a
	// file (a checkpoint folder or a GGUF model); nil for one made in code.
	Arch *arch.Config

	experts    []Expert
	loaded     []bool // loaded[e]: experts[e] holds weights
	shared     *Expert
	sharedGate *kernels.Matrix
	norms      *Norms      // Config.ResidualInput's, else nil
	ckpt       *Checkpoint // owned: Close closes it
	closer     io.Closer   // a GGUF file, owned likewise
	src        *Checkpoint // where the weights were mapped from, to name a fault on it

	workers  int              // SetWorkers
	runner   ExpertRunner     // SetExpertRunner
	numerics kernels.Numerics // SetNumerics

	scratchMu sync.Mutex
	scratches []*scratch

	life   sync.RWMutex // forward passes hold it shared, Close exclusive
	closed bool
}

// Load opens the checkpoint folder dir (or a .gguf file: LoadGGUF) and
// maps the MoE block of layer n.
// It fails with an error naming the file and tensor when a tensor is
// missing or has the wrong shape or dtype, and when layer n is not a MoE
// layer. Close releases the mapping.
func Load(dir string, n int) (*Layer, error) {
	if strings.HasSuffix(dir, ".gguf") {
		return LoadGGUF(dir, n)
	}
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	l, err := LoadFrom(ck, n)
	if err != nil {
		ck.Close()
		return nil, err
	}
	l.ckpt = ck
	return l, nil
}

// LoadFrom takes the MoE block of layer n from an open checkpoint, which
// stays open (and owned by the caller).
func LoadFrom(ck *Checkpoint, n int) (*Layer, error) {
	return LoadSubset(ck, n, nil)
}

// LoadSubset is LoadFrom for the routed experts keep reports true for (all
// when keep is nil): the others' tensors are not touched. The router and the
// shared expert are always loaded. Tokens routed to an expert not held make
// Forward fail.
func LoadSubset(ck *Checkpoint, n int, keep func(e int) bool) (*Layer, error) {
	cfg := ck.Config
	if err := ck.Arch.MoELayer(n); err != nil {
		return nil, fmt.Errorf("moe: %s: %w", ck.Dir, err)
	}
	if cfg.DoubleWideFrom > 0 && n >= cfg.DoubleWideFrom {
		wide := *cfg // gemma4's KV-shared layers: a dense MLP twice as wide
		wide.SharedInter *= 2
		wide.DoubleWideFrom = 0
		cfg = &wide
	}
	names := ck.Arch.MoENames(n, ck.Has)
	H, I, E := cfg.Hidden, cfg.Inter, cfg.NumExperts
	var w Weights
	var err error
	if w.Gate, err = ck.Matrix(names.Gate, E, H); err != nil {
		return nil, err
	}
	// The router (like the bias and qwen2_moe's shared-expert gate) is small
	// and read by every token: a copy, so that it cannot change under a
	// running layer when the file does.
	w.Gate = w.Gate.Clone()
	if err := checkFiniteMatrix(fmt.Sprintf("checkpoint %s: tensor %q", ck.Dir, names.Gate), w.Gate); err != nil {
		return nil, err
	}
	// vector reads a bias [experts], checked finite.
	vector := func(name string, rows int) ([]float32, error) {
		return ck.vector(name, rows, E)
	}
	if cfg.RouterBias {
		if w.RouterBias, err = vector(names.RouterBias, 0); err != nil {
			return nil, err
		}
	}
	switch {
	case cfg.HashLayer(n):
		if w.TokenExperts, err = ck.Int32s(names.TokenExperts, cfg.VocabSize, cfg.TopK); err != nil {
			return nil, err
		}
	case cfg.Method == NoAuxTC:
		if w.Bias, err = vector(names.Bias, names.BiasRows); err != nil {
			return nil, err
		}
	}
	if cfg.ResidualInput {
		if w.RouterScale, err = ck.vector(names.RouterScale, 0, H); err != nil {
			return nil, err
		}
		if w.ExpertScale, err = vector(names.ExpertScale, 0); err != nil {
			return nil, err
		}
		w.Norms = new(Norms)
		for i, p := range []*[]float32{&w.Norms.Pre, &w.Norms.Post1, &w.Norms.Pre2, &w.Norms.Post2, &w.Norms.Post} {
			if *p, err = ck.vector(names.Norms[i], 0, H); err != nil {
				return nil, err
			}
		}
	}
	if names.Fused != "" && names.Expert != nil && !ck.Has(names.Fused+"gate_up_proj") {
		// A family whose experts are fused in its Hugging Face form
		// (qwen3_5_moe, qwen3_vl_moe, deepseek_v4) but a checkpoint that
		// stores them expert by expert, as quantized releases made Linear
		// by Linear do: read those (in any format ck.Matrix reads).
		if g, _, _ := names.Expert(0); ck.Has(g) || ck.Has(g+"_packed") {
			names.Fused = ""
		}
	}
	if names.Fused != "" {
		load := map[arch.FusedLayout]func(*Checkpoint, string, func(int) bool) ([]Expert, error){
			arch.FusedOI: fusedExperts, arch.FusedIO: fusedExpertsIO, arch.FusedGptOss: gptOssExperts, arch.Stacked: stackedExperts}[names.Layout]
		if w.Experts, err = load(ck, names.Fused, keep); err != nil {
			return nil, err
		}
	} else {
		w.Experts, err = eachExpert(E, keep, func(e int, x *Expert) error {
			g, u, d := names.Expert(e)
			var err error
			*x, err = loadExpert(ck, g, u, d, H, I)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	if cfg.SharedInter > 0 {
		s, err := loadExpert(ck, names.Shared[0], names.Shared[1], names.Shared[2], H, cfg.SharedInter)
		if err != nil {
			return nil, err
		}
		w.Shared = &s
		if cfg.SharedGate {
			g, err := ck.Matrix(names.SharedGate, 1, H)
			if err != nil {
				return nil, err
			}
			g = g.Clone()
			if err := checkFiniteMatrix(fmt.Sprintf("checkpoint %s: tensor %q", ck.Dir, names.SharedGate), g); err != nil {
				return nil, err
			}
			w.SharedGate = &g
		}
	}
	l, err := New(cfg, w)
	if err != nil {
		return nil, ck.explainFault(err)
	}
	l.src, l.Arch = ck, ck.Arch
	return l, nil
}

// vector reads tensor name, [n] (or [rows, n] with rows > 0, of which it
// takes the first row), checked finite, as float32.
func (ck *Checkpoint) vector(name string, rows, n int) ([]float32, error) {
	shape := []int{n}
	if rows > 0 {
		shape = []int{rows, n}
	}
	b, err := ck.Matrix(name, shape...)
	if err != nil {
		return nil, err
	}
	if err := checkFiniteMatrix(fmt.Sprintf("checkpoint %s: tensor %q", ck.Dir, name), b); err != nil {
		return nil, err
	}
	v := make([]float32, n)
	b.RowF32(0, v)
	return v, nil
}

func loadExpert(ck *Checkpoint, gate, up, down string, hidden, inter int) (Expert, error) {
	var x Expert
	var err error
	if x.Gate, err = ck.Matrix(gate, inter, hidden); err != nil {
		return x, err
	}
	if x.Up, err = ck.Matrix(up, inter, hidden); err != nil {
		return x, err
	}
	x.Down, err = ck.Matrix(down, hidden, inter)
	return x, err
}

// New makes a layer from weights already in memory, checking every shape
// against cfg. On machines with SIMD kernels the experts' matrices are
// packed for them (a copy in the same dtype, see kernels.Pack) unless they
// are packed already; w is not changed.
func New(cfg *Config, w Weights) (*Layer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("moe: %w", err)
	}
	router, err := newRouter(cfg, &w)
	if err != nil {
		return nil, err
	}
	if (w.Norms != nil) != cfg.ResidualInput {
		return nil, fmt.Errorf("moe: block norms given: %v, the %s block owns its norms: %v", w.Norms != nil, cfg.ModelType, cfg.ResidualInput)
	}
	if w.Norms != nil {
		for _, n := range w.Norms.list() {
			if len(n.w) != cfg.Hidden {
				return nil, errkind.Errorf(ErrShape, "moe: norm %s has %d weights, want hidden size %d", n.name, len(n.w), cfg.Hidden)
			}
			if _, err := finite64("norm "+n.name+" weight", n.w); err != nil {
				return nil, err
			}
		}
	}
	// The small weights every token reads: a NaN in them makes every
	// output NaN. (The experts' are checked on request: CheckWeights.)
	if err := checkFiniteMatrix("router weight", w.Gate); err != nil {
		return nil, err
	}
	for e, v := range w.Bias {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, errkind.Errorf(ErrNonFinite, "moe: router bias [%d] is %v", e, v)
		}
	}
	if w.SharedGate != nil {
		if err := checkFiniteMatrix("shared expert gate", *w.SharedGate); err != nil {
			return nil, err
		}
	}
	if len(w.Experts) != cfg.NumExperts {
		return nil, errkind.Errorf(ErrShape, "moe: %d experts given, the config has %d", len(w.Experts), cfg.NumExperts)
	}
	for e, x := range w.Experts {
		if x.Gate.Rows == 0 && x.Up.Rows == 0 && x.Down.Rows == 0 {
			continue // not held here (LoadSubset)
		}
		if err := checkExpert(x, cfg.Hidden, cfg.Inter); err != nil {
			return nil, fmt.Errorf("moe: expert %d: %w", e, err)
		}
		if err := checkExpertBias(x, cfg); err != nil {
			return nil, fmt.Errorf("moe: expert %d: %w", e, err)
		}
	}
	if (w.Shared != nil) != (cfg.SharedInter > 0) {
		return nil, fmt.Errorf("moe: shared expert given: %v, the config's shared width is %d", w.Shared != nil, cfg.SharedInter)
	}
	if w.Shared != nil {
		if err := checkExpert(*w.Shared, cfg.Hidden, cfg.SharedInter); err != nil {
			return nil, fmt.Errorf("moe: shared expert: %w", err)
		}
	}
	if (w.SharedGate != nil) != cfg.SharedGate {
		return nil, fmt.Errorf("moe: shared expert gate given: %v, the config wants one: %v", w.SharedGate != nil, cfg.SharedGate)
	}
	if g := w.SharedGate; g != nil && (g.Rows != 1 || g.Cols != cfg.Hidden) {
		return nil, errkind.Errorf(ErrMissingTensor, "moe: shared expert gate is [%d, %d], want [1, %d]", g.Rows, g.Cols, cfg.Hidden)
	}
	loaded := make([]bool, len(w.Experts))
	for e := range loaded {
		loaded[e] = w.Experts[e].Gate.Rows > 0
	}
	if kernels.PacksWeights() {
		var copied float64 // what packing copies: the matrices not packed yet
		for _, x := range append(w.Experts, *cmp.Or(w.Shared, &Expert{})) {
			for _, m := range []kernels.Matrix{x.Gate, x.Up, x.Down} {
				if !m.Packed() {
					copied += float64(m.Bytes())
				}
			}
		}
		if err := memlimit.Check(fmt.Sprintf("moe: packing the experts of a %s layer", cfg.ModelType), copied); err != nil {
			return nil, err
		}
		var err error
		if w.Experts, err = packExperts(w.Experts); err != nil {
			return nil, fmt.Errorf("moe: packing the experts: %w", err)
		}
		if w.Shared != nil {
			s, err := packExperts([]Expert{*w.Shared})
			if err != nil {
				return nil, fmt.Errorf("moe: packing the shared expert: %w", err)
			}
			w.Shared = &s[0]
		}
	}
	return &Layer{Config: cfg, Router: router, experts: w.Experts, loaded: loaded, shared: w.Shared, sharedGate: w.SharedGate, norms: w.Norms}, nil
}

// packExperts returns the experts with their matrices packed, on
// GOMAXPROCS goroutines; a fault reading them (a mapped file cut short) is
// an error.
func packExperts(xs []Expert) ([]Expert, error) {
	out := make([]Expert, len(xs))
	err := kernels.Parallel(context.Background(), 0, len(xs), func(e int) {
		x := xs[e]
		x.Gate, x.Up, x.Down = kernels.Pack(x.Gate), kernels.Pack(x.Up), kernels.Pack(x.Down)
		out[e] = x
	})
	return out, err
}

// checkExpertBias checks that a routed expert has the biases its family
// has (cfg.ExpertBias: all three, of their projections' widths) and no
// others, all finite.
func checkExpertBias(x Expert, cfg *Config) error {
	if !cfg.ExpertBias {
		if x.GateBias != nil || x.UpBias != nil || x.DownBias != nil {
			return errkind.Errorf(ErrShape, "biases given, but %s experts have none", cfg.ModelType)
		}
		return nil
	}
	for _, b := range []struct {
		name string
		v    []float32
		n    int
	}{{"gate", x.GateBias, cfg.Inter}, {"up", x.UpBias, cfg.Inter}, {"down", x.DownBias, cfg.Hidden}} {
		if len(b.v) != b.n {
			return errkind.Errorf(ErrShape, "%s projection bias has %d values, want %d", b.name, len(b.v), b.n)
		}
		for i, v := range b.v {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return errkind.Errorf(ErrNonFinite, "%s projection bias [%d] is %v", b.name, i, v)
			}
		}
	}
	return nil
}

func checkExpert(x Expert, hidden, inter int) error {
	for _, m := range []struct {
		name       string
		m          kernels.Matrix
		rows, cols int
	}{{"gate", x.Gate, inter, hidden}, {"up", x.Up, inter, hidden}, {"down", x.Down, hidden, inter}} {
		if m.m.Rows != m.rows || m.m.Cols != m.cols {
			return errkind.Errorf(ErrMissingTensor, "%s projection is [%d, %d], want [%d, %d]", m.name, m.m.Rows, m.m.Cols, m.rows, m.cols)
		}
	}
	return nil
}

// Close releases the checkpoint mapping of a loaded layer, after the
// forward passes in flight; later ones return ErrClosed. A second Close
// does nothing.
func (l *Layer) Close() error {
	l.life.Lock()
	defer l.life.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.closer != nil {
		return l.closer.Close()
	}
	if l.ckpt == nil {
		return nil
	}
	return l.ckpt.Close()
}

// Forward computes y = MoE(x) for x, y [tokens, hidden] float32: the routed
// experts plus the shared expert where the family has one (no residual, no
// norm).
func (l *Layer) Forward(ctx context.Context, x, y []float32) error {
	return l.ForwardRouting(ctx, x, y, nil, nil)
}

// ForwardRouting is Forward that also returns the routing: ids [tokens,
// top_k], each row ascending, and weights in the same order (after
// normalisation and scaling). Either may be nil.
func (l *Layer) ForwardRouting(ctx context.Context, x, y []float32, ids []int32, weights []float32) error {
	return l.ForwardTokens(ctx, x, nil, y, ids, weights)
}

// ForwardTokens is ForwardRouting given the batch's token ids [tokens],
// which a layer that chooses its experts by token id (deepseek_v4's hash
// layers: TokenRouted) needs; other layers ignore them (nil will do).
//
// For a family whose block owns its norms (Config.ResidualInput, gemma4),
// x is the residual stream and y what the decoder adds to it.
func (l *Layer) ForwardTokens(ctx context.Context, x []float32, tokens []int32, y []float32, ids []int32, weights []float32) error {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return errkind.Errorf(ErrClosed, "moe: forward on a closed layer")
	}
	c := l.Config
	H, K := c.Hidden, c.TopK
	if len(x)%H != 0 {
		return errkind.Errorf(ErrShape, "moe: input has %d values, not a multiple of hidden size %d", len(x), H)
	}
	T := len(x) / H
	if len(y) != len(x) {
		return errkind.Errorf(ErrShape, "moe: output has %d values, want %d ([%d tokens, %d])", len(y), len(x), T, H)
	}
	if ids != nil && len(ids) != T*K || weights != nil && len(weights) != T*K {
		return errkind.Errorf(ErrShape, "moe: routing outputs have %d ids and %d weights, want [%d tokens, top-%d] = %d", len(ids), len(weights), T, K, T*K)
	}
	if err := CheckFinite(x, H); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if T == 0 {
		return nil
	}
	if ids == nil {
		ids = make([]int32, T*K)
	}
	if weights == nil {
		weights = make([]float32, T*K)
	}
	if err := l.RouteTokens(ctx, x, tokens, ids, weights); err != nil {
		return err
	}
	sc := l.getScratch()
	defer l.putScratch(sc)
	g, err := l.Group(ids, weights, K, false, buffers.Grow(&sc.out, T*K*H))
	if err != nil {
		return err
	}
	// in is what the experts read: x, or (a block owning its norms) the
	// experts' normed input, then the dense MLP's.
	in, sharedRows := x, []int32(nil)
	if l.norms != nil {
		if in, sharedRows, err = l.normInputs(ctx, x, sc); err != nil {
			return err
		}
	}
	// The grouped expert FFN, the shared expert included as one more group.
	groups := g.Groups
	shared := l.SharedFFN(in, sharedRows, buffers.Grow(&sc.shared, T*H))
	if shared != nil {
		groups = append(groups, *shared)
	}
	if err := l.RunExperts(ctx, in, groups, &sc.ffn); err != nil {
		return err
	}
	var sharedOut []float32
	if shared != nil {
		sharedOut = shared.Out
	}
	if l.norms != nil {
		Combine(y, g.Out, g.RowOf, K, H, nil)
		if err := l.normOutputs(ctx, y, sharedOut); err != nil {
			return err
		}
	} else {
		Combine(y, g.Out, g.RowOf, K, H, sharedOut)
	}
	return CheckOutput(y, H)
}

// normInputs is the input of a block owning its norms (gemma4) for the
// residual x [tokens, hidden]: [2·tokens, hidden], the experts' input then
// the dense MLP's (BlockInputs), and the dense MLP's rows of it.
func (l *Layer) normInputs(ctx context.Context, x []float32, sc *scratch) ([]float32, []int32, error) {
	T := len(x) / l.Config.Hidden
	in := buffers.Grow(&sc.in, 2*len(x))
	rows := make([]int32, T)
	for t := range rows {
		rows[t] = int32(T + t)
	}
	return in, rows, l.blockInputs(ctx, x, in[:len(x)], in[len(x):])
}

// BlockInputs is, for a block that owns its norms (Config.ResidualInput:
// gemma4), what its experts and its dense MLP read for the residual x
// [tokens, hidden]: pre_feedforward_layernorm_2(x) and
// pre_feedforward_layernorm(x), each [tokens, hidden]. Expert parallelism
// dispatches the first and runs the dense MLP on the second.
func (l *Layer) BlockInputs(ctx context.Context, x []float32) (experts, dense []float32, err error) {
	if l.norms == nil {
		return nil, nil, fmt.Errorf("moe: a %s block does not own its norms: its experts read x", l.Config.ModelType)
	}
	experts, dense = make([]float32, len(x)), make([]float32, len(x))
	return experts, dense, l.blockInputs(ctx, x, experts, dense)
}

func (l *Layer) blockInputs(ctx context.Context, x, experts, dense []float32) error {
	H, eps := l.Config.Hidden, l.Config.RMSNormEps
	return l.perTokens(ctx, len(x)/H, func(t int) {
		xt := x[t*H : (t+1)*H]
		inv := rmsInverse(xt, eps)
		scaleRow(experts[t*H:][:H], xt, l.norms.Pre2, inv)
		scaleRow(dense[t*H:][:H], xt, l.norms.Pre, inv)
	})
}

// BlockOutput makes y [tokens, hidden], the experts' weighted sum (Combine
// without a shared expert), the output of a block that owns its norms:
// post_feedforward_layernorm(post_feedforward_layernorm_2(y) +
// post_feedforward_layernorm_1(dense)) for the dense MLP's output dense.
func (l *Layer) BlockOutput(ctx context.Context, y, dense []float32) error {
	if l.norms == nil {
		return fmt.Errorf("moe: a %s block does not own its norms", l.Config.ModelType)
	}
	if len(dense) != len(y) {
		return errkind.Errorf(ErrShape, "moe: dense MLP output has %d values, the block output %d", len(dense), len(y))
	}
	return l.normOutputs(ctx, y, dense)
}

// normOutputs is BlockOutput.
func (l *Layer) normOutputs(ctx context.Context, y, dense []float32) error {
	H, eps := l.Config.Hidden, l.Config.RMSNormEps
	return l.perTokens(ctx, len(y)/H, func(t int) {
		yt, dt := y[t*H:(t+1)*H], dense[t*H:][:H]
		a, b := rmsInverse(yt, eps), rmsInverse(dt, eps)
		p2, p1 := l.norms.Post2, l.norms.Post1
		for i := range yt {
			// Each norm's output rounded to float32, as the norm
			// modules' outputs are, then summed.
			yt[i] = float32(float64(yt[i])*a*float64(p2[i])) + float32(float64(dt[i])*b*float64(p1[i]))
		}
		scaleRow(yt, yt, l.norms.Post, rmsInverse(yt, eps))
	})
}

// perTokens runs fn for tokens [0, T) in chunks on the layer's workers.
func (l *Layer) perTokens(ctx context.Context, T int, fn func(t int)) error {
	const chunk = 16
	return kernels.Parallel(ctx, l.workerCount(), (T+chunk-1)/chunk, func(i int) {
		for t := i * chunk; t < min((i+1)*chunk, T); t++ {
			fn(t)
		}
	})
}

// CheckOutput returns an ErrNonFinite error naming the first token of a
// layer's output y [tokens, hidden] that holds a NaN or an infinity (its
// input having been finite).
func CheckOutput(y []float32, hidden int) error {
	if i := kernels.NonFinite(y); i >= 0 {
		return errkind.Errorf(ErrNonFinite, "moe: output token %d is %v at column %d, from finite input: the expert weights hold a non-finite value (CheckWeights finds it) or the products overflow fp32", i/hidden, y[i], i%hidden)
	}
	return nil
}

// Grouped is a batch's (token, slot) pairs laid out as the grouped expert
// FFN of the experts a layer holds, the middle of the one MoE pipeline
// (route → group → run the groups → combine) that Forward, ep's dispatched
// rows and gather mode's shard share.
type Grouped struct {
	// Groups has one group per held expert that a pair chose, in ascending
	// expert id: its rows the tokens that chose it (ascending), scaled by
	// their routing weights, its output a block of Out.
	Groups []kernels.FFNGroup
	// RowOf is each pair's row of Out ([tokens·topK]); -1 for a pair of an
	// expert the layer does not hold (a partial grouping).
	RowOf []int32
	// Out is the groups' outputs, [rows, hidden] in group order.
	Out []float32
}

// Group lays out the pairs of ids [tokens, topK] (each row ascending; the
// routing weights in weights) over the experts the layer holds, the
// outputs in buf where it is large enough. A pair of an expert the layer
// does not hold is an error, unless partial: then it is left out (RowOf
// -1), a shard's share of the tokens.
func (l *Layer) Group(ids []int32, weights []float32, topK int, partial bool, buf []float32) (*Grouped, error) {
	c := l.Config
	H := c.Hidden
	if topK < 1 || len(ids)%topK != 0 || len(weights) != len(ids) {
		return nil, errkind.Errorf(ErrShape, "moe: grouping %d ids and %d weights of top-%d", len(ids), len(weights), topK)
	}
	T := len(ids) / topK
	lay, err := kernels.NewLayout(ids, T, topK, c.NumExperts, 1)
	if err != nil {
		return nil, err
	}
	g := &Grouped{RowOf: make([]int32, len(ids))}
	rows := 0
	for e := range l.experts {
		if lay.Counts[e] > 0 && l.loaded[e] {
			rows += int(lay.Counts[e])
		} else if lay.Counts[e] > 0 && !partial {
			return nil, fmt.Errorf("moe: tokens routed to expert %d, which this layer did not load", e)
		}
	}
	if cap(buf) >= rows*H {
		g.Out = buf[:rows*H]
	} else {
		g.Out = make([]float32, rows*H)
	}
	token := make([]int32, rows)
	scale := make([]float32, rows)
	for p := range g.RowOf {
		g.RowOf[p] = -1
	}
	r := 0
	for e := range l.experts {
		lo, hi := int(lay.Offsets[e]), int(lay.Offsets[e]+lay.Counts[e])
		if hi == lo || !l.loaded[e] {
			continue
		}
		first := r
		for _, p := range lay.Pairs[lo:hi] {
			token[r], scale[r] = p/int32(topK), weights[p]
			g.RowOf[p] = int32(r)
			r++
		}
		x := l.experts[e]
		g.Groups = append(g.Groups, kernels.FFNGroup{Gate: x.Gate, Up: x.Up, Down: x.Down,
			Rows: token[first:r], Scale: scale[first:r], Out: g.Out[first*H : r*H], Expert: e,
			GateBias: x.GateBias, UpBias: x.UpBias, DownBias: x.DownBias, Act: c.Act, ScaleInput: c.WeightOnInput})
	}
	return g, nil
}

// An ExpertRunner computes grouped expert FFNs with the contract of
// kernels.GroupedFFN, finding each group's weights by its Expert; the CUDA
// backend (moegpu.Experts) keeps them on a GPU.
type ExpertRunner interface {
	GroupedFFN(ctx context.Context, x []float32, groups []kernels.FFNGroup) error
}

// A GraphVoter is a device runner (of experts, attention, a MoE stage or a
// whole layer) that replays captured graphs (CUDA graphs) when the step
// allows: the decode loop passes it the coordinator's vote (every rank in
// decode or idle) before each step.
type GraphVoter interface {
	AllowGraph(ok bool)
}

// A GraphCounter is a device runner that counts the steps it replayed from
// a captured graph (what a run reports, to show its graphs replayed).
type GraphCounter interface {
	GraphReplays() int
}

// RunExperts computes the groups (built from this layer's experts) on the
// layer's runner, or on the CPU kernels with sc (nil: none) as scratch.
func (l *Layer) RunExperts(ctx context.Context, x []float32, groups []kernels.FFNGroup, sc *kernels.Scratch) error {
	if l.runner != nil {
		return l.runner.GroupedFFN(ctx, x, groups)
	}
	return l.src.explainFault(kernels.GroupedFFN(ctx, l.workerCount(), x, groups, sc))
}

// Route chooses the experts of every token of x [tokens, hidden]: ids and
// weights [tokens, top_k], as ForwardRouting returns them.
func (l *Layer) Route(ctx context.Context, x []float32, ids []int32, weights []float32) error {
	return l.RouteTokens(ctx, x, nil, ids, weights)
}

// RouteTokens is Route given the batch's token ids [tokens], which a
// layer that chooses by token id needs (TokenRouted).
func (l *Layer) RouteTokens(ctx context.Context, x []float32, tokens, ids []int32, weights []float32) error {
	const chunk = 16
	T := len(x) / l.Config.Hidden
	if err := l.Router.CheckTokens(tokens, T); err != nil {
		return err
	}
	workers := l.workerCount()
	if chunks := (T + chunk - 1) / chunk; chunks >= workers || l.Config.NumExperts < 2*routeExperts {
		return kernels.Parallel(ctx, workers, chunks, func(i int) {
			l.Router.route(x, tokens, ids, weights, i*chunk, min((i+1)*chunk, T))
		})
	}
	// Fewer chunks than workers (decode): the logits split by experts
	// instead, each the same dot product, then every token's choice.
	r := l.Router
	E := l.Config.NumExperts
	logits := make([]float64, T*E)
	in := r.input(x, 0, T)
	if err := kernels.Parallel(ctx, workers, (E+routeExperts-1)/routeExperts, func(i int) {
		kernels.RouterLogitsExperts(logits, in, r.weight, i*routeExperts, min((i+1)*routeExperts, E))
	}); err != nil {
		return err
	}
	r.choose(logits, tokens, ids, weights, 0, T)
	return nil
}

// routeExperts is the experts of one item of RouteTokens' logits split by
// experts.
const routeExperts = 16

// TokenRouted reports whether the layer chooses its experts by token id
// (a deepseek_v4 hash layer): its forward passes need the token ids
// (ForwardTokens).
func (l *Layer) TokenRouted() bool { return l.Router.TokenRouted() }

// SharedFFN returns the shared expert as a group over the rows of x
// [tokens, hidden] (rows: nil for all of them, in order), its gate applied
// as the row scale (qwen2_moe), writing out [rows, hidden] (nil: a new
// buffer); nil if the family has no shared expert.
func (l *Layer) SharedFFN(x []float32, rows []int32, out []float32) *kernels.FFNGroup {
	if l.shared == nil {
		return nil
	}
	H := l.Config.Hidden
	if rows == nil {
		rows = make([]int32, len(x)/H)
		for t := range rows {
			rows[t] = int32(t)
		}
	}
	var gate []float32
	if l.sharedGate != nil {
		gate = SharedGate(*l.sharedGate, x, rows, make([]float32, len(rows)))
	}
	if out == nil {
		out = make([]float32, len(rows)*H)
	}
	s := l.shared
	return &kernels.FFNGroup{Gate: s.Gate, Up: s.Up, Down: s.Down, Rows: rows, Scale: gate, Out: out[:len(rows)*H],
		Expert: kernels.SharedExpert, Act: l.Config.SharedAct}
}

// SharedGate is qwen2_moe's shared-expert gate: out[i] = sigmoid(x[rows[i]]
// · g) for g [1, hidden] and x [tokens, hidden], one float64 dot product per
// row (every row of x when rows is nil). It returns out.
func SharedGate(g kernels.Matrix, x []float32, rows []int32, out []float32) []float32 {
	H := g.Cols
	logit := make([]float64, 1)
	row := func(i, t int) {
		kernels.RouterLogits(logit, x[t*H:(t+1)*H], g)
		out[i] = float32(1 / (1 + math.Exp(-logit[0])))
	}
	if rows == nil {
		for t := 0; t < len(x)/H; t++ {
			row(t, t)
		}
		return out
	}
	for i, t := range rows {
		row(i, int(t))
	}
	return out
}

// scratch is one forward pass's reusable buffers.
type scratch struct {
	out, shared, in []float32
	ffn             kernels.Scratch
}

// getScratch takes a scratch from the layer's free list; forward passes
// reuse each other's buffers instead of faulting in fresh memory.
func (l *Layer) getScratch() *scratch {
	l.scratchMu.Lock()
	defer l.scratchMu.Unlock()
	if n := len(l.scratches); n > 0 {
		s := l.scratches[n-1]
		l.scratches = l.scratches[:n-1]
		return s
	}
	return new(scratch)
}

func (l *Layer) putScratch(s *scratch) {
	l.scratchMu.Lock()
	l.scratches = append(l.scratches, s)
	l.scratchMu.Unlock()
}

// Combine sums each token's expert outputs into y [tokens, hidden]: out
// holds weighted expert outputs [rows, hidden], rows[t·k+j] is the row of
// token t's j-th expert (experts ascending); the sum runs over j in order,
// then adds shared[t] (nil for none); a row of -1 (an expert another rank
// holds) is left out of the sum. This is the one combine order of moex.
func Combine(y, out []float32, rows []int32, k, hidden int, shared []float32) {
	T := len(rows) / k
	for t := 0; t < T; t++ {
		yt := y[t*hidden : (t+1)*hidden]
		first := true
		for j := 0; j < k; j++ {
			r := rows[t*k+j]
			if r < 0 {
				continue // an expert of another rank
			}
			o := out[int(r)*hidden:][:hidden]
			if first {
				copy(yt, o)
				first = false
				continue
			}
			for i := range yt {
				yt[i] += o[i]
			}
		}
		if first {
			clear(yt)
		}
		if shared != nil {
			o := shared[t*hidden:][:hidden]
			for i := range yt {
				yt[i] += o[i]
			}
		}
	}
}

// Subset returns a layer that shares this one's weights but holds only the
// routed experts keep reports true for (a rank's shard).
func (l *Layer) Subset(keep func(e int) bool) *Layer {
	loaded := make([]bool, len(l.loaded))
	for e := range loaded {
		loaded[e] = l.loaded[e] && keep(e)
	}
	return &Layer{Config: l.Config, Router: l.Router, experts: l.experts, loaded: loaded, src: l.src,
		shared: l.shared, sharedGate: l.sharedGate, norms: l.norms, workers: l.workers, numerics: l.numerics}
}

// Expert returns routed expert e's weights, and whether this layer holds
// them (LoadSubset loads only some).
func (l *Layer) Expert(e int) (Expert, bool) {
	if e < 0 || e >= len(l.experts) || !l.loaded[e] {
		return Expert{}, false
	}
	return l.experts[e], true
}

// SharedExpert returns the shared-expert MLP and qwen2_moe's gate on its
// output [1, hidden] (nil for other families); nil, nil when there is none.
func (l *Layer) SharedExpert() (*Expert, *kernels.Matrix) { return l.shared, l.sharedGate }

// WorkerCount is the goroutine count a forward pass uses.
func (l *Layer) WorkerCount() int { return l.workerCount() }

// SetWorkers sets the number of goroutines a forward pass uses; 0 (the
// default) means GOMAXPROCS. The result does not depend on it. It waits for
// the forward passes in flight.
func (l *Layer) SetWorkers(n int) {
	l.life.Lock()
	defer l.life.Unlock()
	l.workers = max(n, 0)
}

// SetNumerics makes later forward passes compute the experts' products in
// mode n. Layers start in kernels.Exact. kernels.Int8Dot (llama.cpp's way:
// activations rounded to int8 per 32, integer dot products; see
// kernels.Numerics) needs every routed expert's matrices in UINT4, INT8,
// MXFP4 or INT4 with groups of 8, 16 or 32 (GGUF's Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, Q4_K, Q5_K, Q6_K, MXFP4); kernels.BF16Dot (activations rounded to bf16, vdpbf16ps pairs)
// needs them in BF16. Otherwise it is an error naming the first that is
// not, and the layer is unchanged. The shared expert takes the mode where
// all three of its matrices can, and stays exact otherwise (files that
// keep it in another dtype). The experts are repacked for the mode, so a
// layer in another mode does not go back (load it again). It waits for
// the forward passes in flight; subsets made before keep their mode.
func (l *Layer) SetNumerics(n kernels.Numerics) error {
	l.life.Lock()
	defer l.life.Unlock()
	if n == l.numerics {
		return nil
	}
	if l.numerics != kernels.Exact || n == kernels.Exact {
		return fmt.Errorf("moe: a layer in %v numerics cannot go to %v: load it again", l.numerics, n)
	}
	if l.runner != nil {
		return fmt.Errorf("moe: %v numerics run on the CPU kernels; this layer's experts run elsewhere", n)
	}
	pack := func(what string, x Expert) (Expert, error) {
		for _, m := range []struct {
			name string
			m    *kernels.Matrix
		}{{"gate", &x.Gate}, {"up", &x.Up}, {"down", &x.Down}} {
			p, err := n.Pack(*m.m)
			if err != nil {
				return x, errkind.Errorf(ErrUnsupportedFormat, "moe: %s's %s: %w", what, m.name, err)
			}
			*m.m = p
		}
		return x, nil
	}
	experts := slices.Clone(l.experts)
	for e, x := range experts {
		if !l.loaded[e] {
			continue
		}
		var err error
		if experts[e], err = pack(fmt.Sprintf("expert %d", e), x); err != nil {
			return err
		}
	}
	shared := l.shared
	if shared != nil {
		if s, err := pack("the shared expert", *shared); err == nil {
			shared = &s
		}
	}
	l.experts, l.shared, l.numerics = experts, shared, n
	return nil
}

// Numerics is the mode the experts' products are computed in.
func (l *Layer) Numerics() kernels.Numerics { return l.numerics }

// SetExpertRunner makes r run the grouped expert FFNs of later forward
// passes; nil (the default) runs them on the CPU kernels. It waits for the
// forward passes in flight. Subset does not carry the runner over (a runner
// holds its layer's weights).
func (l *Layer) SetExpertRunner(r ExpertRunner) {
	l.life.Lock()
	defer l.life.Unlock()
	l.runner = r
}

// checkFiniteMatrix returns an ErrNonFinite error naming the first NaN or
// infinite element of m (its dequantized value), if any.
func checkFiniteMatrix(what string, m kernels.Matrix) error {
	row := make([]float32, m.Cols)
	for r := 0; r < m.Rows; r++ {
		m.RowF32(r, row)
		for c, v := range row {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return errkind.Errorf(ErrNonFinite, "moe: %s [%d, %d] is %v", what, r, c, v)
			}
		}
	}
	return nil
}

// CheckWeights reads every weight of the experts the layer holds (and the
// shared expert's), dequantized, and returns an ErrNonFinite error naming
// the first NaN or infinity: a full pass over the weights, on request
// (moex's --check-weights), where New checks only the router's. It returns
// the context's error if that ends first.
func (l *Layer) CheckWeights(ctx context.Context) error {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return errkind.Errorf(ErrClosed, "moe: check on a closed layer")
	}
	check := func(what string, x Expert) error {
		for _, m := range []struct {
			name string
			w    kernels.Matrix
		}{{"gate_proj", x.Gate}, {"up_proj", x.Up}, {"down_proj", x.Down}} {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := checkFiniteMatrix(what+" "+m.name, m.w); err != nil {
				return err
			}
		}
		return nil
	}
	all := func() error {
		for e, x := range l.experts {
			if !l.loaded[e] {
				continue
			}
			if err := check(fmt.Sprintf("expert %d", e), x); err != nil {
				return err
			}
		}
		if l.shared != nil {
			return check("shared expert", *l.shared)
		}
		return nil
	}
	// On kernels.Parallel, so that a fault on a mapped file is an error.
	var err error
	if perr := kernels.Parallel(ctx, 1, 1, func(int) { err = all() }); perr != nil && err == nil {
		return l.src.explainFault(perr)
	}
	return err
}

// CheckFinite returns an error naming the first token of x [tokens, hidden]
// that holds a NaN or an infinity.
func CheckFinite(x []float32, hidden int) error {
	if i := kernels.NonFinite(x); i >= 0 {
		return errkind.Errorf(ErrNonFinite, "moe: input token %d has a non-finite value %v at column %d", i/hidden, x[i], i%hidden)
	}
	return nil
}

func (l *Layer) workerCount() int {
	if l.workers > 0 {
		return l.workers
	}
	return runtime.GOMAXPROCS(0)
}

// WeightBytesRead returns the weight bytes a forward pass with routing ids
// reads: the router, each distinct routed expert once, and the shared
// expert. Experts no token chose cost nothing.
func (l *Layer) WeightBytesRead(ids []int32) int64 {
	size := kernels.Matrix.Bytes
	expert := func(x *Expert) int64 {
		return size(x.Gate) + size(x.Up) + size(x.Down) + 4*int64(len(x.GateBias)+len(x.UpBias)+len(x.DownBias))
	}
	n := size(l.Router.weight) + 8*int64(len(l.Router.logitBias))
	seen := make([]bool, len(l.experts))
	for _, id := range ids {
		if id >= 0 && int(id) < len(seen) && !seen[id] && l.loaded[id] {
			seen[id] = true
			n += expert(&l.experts[id])
		}
	}
	if l.shared != nil {
		n += expert(l.shared)
	}
	if l.sharedGate != nil {
		n += size(*l.sharedGate)
	}
	return n
}

// WeightDType is the dtype the routed experts' weights are stored in.
func (l *Layer) WeightDType() kernels.DType {
	for e, x := range l.experts {
		if l.loaded[e] {
			return x.Gate.DType
		}
	}
	return l.Router.weight.DType
}
