// Package moe is the Mixture-of-Experts block of a transformer: model
// configs read from Hugging Face config.json files, checkpoints read from
// memory-mapped safetensors, gating for the mixtral, qwen2_moe, qwen3_moe,
// deepseek_v2 and deepseek_v3 families, the dispatch layout, the grouped
// SwiGLU expert FFN and the combine step.
//
// A forward pass is gate → dispatch layout → grouped expert FFN → combine.
// Each token's output is the sum of its experts' weighted outputs in
// ascending expert id, then the shared expert: one fixed order, so a
// token's bits do not depend on the batch it is in or on the thread count.
package moe

import (
	"context"
	"fmt"
	"math"
	"runtime"

	"github.com/moex-project/moex/kernels"
)

// Expert is one SwiGLU MLP: down(silu(gate·x) ⊙ up·x).
type Expert struct {
	Gate, Up kernels.Matrix // [inter, hidden]
	Down     kernels.Matrix // [hidden, inter]
}

// Weights are the tensors of one MoE block.
type Weights struct {
	Gate       kernels.Matrix  // [experts, hidden]
	Bias       []float32       // [experts]: e_score_correction_bias, NoAuxTC only
	Experts    []Expert        // [experts]
	Shared     *Expert         // the shared-expert MLP, or nil
	SharedGate *kernels.Matrix // [1, hidden]: qwen2_moe's shared_expert_gate, or nil
}

// Layer is one MoE block, ready to run.
type Layer struct {
	Config *Config
	Router *Router

	experts    []Expert
	shared     *Expert
	sharedGate *kernels.Matrix
	ckpt       *Checkpoint

	// Workers is the number of goroutines a forward pass uses; 0 means
	// GOMAXPROCS. The result does not depend on it.
	Workers int
}

// Load opens the checkpoint folder dir and maps the MoE block of layer n.
// It fails with an error naming the file and tensor when a tensor is
// missing or has the wrong shape or dtype, and when layer n is not a MoE
// layer. Close releases the mapping.
func Load(dir string, n int) (*Layer, error) {
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
	cfg := ck.Config
	if err := cfg.CheckMoELayer(n); err != nil {
		return nil, fmt.Errorf("moe: %s: %w", ck.Dir, err)
	}
	names := cfg.names(n)
	H, I, E := cfg.Hidden, cfg.Inter, cfg.NumExperts
	var w Weights
	var err error
	if w.Gate, err = ck.Matrix(names.gate, E, H); err != nil {
		return nil, err
	}
	if cfg.Method == NoAuxTC {
		b, err := ck.Matrix(names.bias, E)
		if err != nil {
			return nil, err
		}
		w.Bias = make([]float32, E)
		b.RowF32(0, w.Bias)
	}
	w.Experts = make([]Expert, E)
	for e := range w.Experts {
		g, u, d := names.expert(e)
		if w.Experts[e], err = loadExpert(ck, g, u, d, H, I); err != nil {
			return nil, err
		}
	}
	if cfg.SharedInter > 0 {
		s, err := loadExpert(ck, names.shared[0], names.shared[1], names.shared[2], H, cfg.SharedInter)
		if err != nil {
			return nil, err
		}
		w.Shared = &s
		if cfg.SharedGate {
			g, err := ck.Matrix(names.sharedGate, 1, H)
			if err != nil {
				return nil, err
			}
			w.SharedGate = &g
		}
	}
	return New(cfg, w)
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
// against cfg.
func New(cfg *Config, w Weights) (*Layer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("moe: %w", err)
	}
	router, err := NewRouter(cfg, w.Gate, w.Bias)
	if err != nil {
		return nil, err
	}
	if len(w.Experts) != cfg.NumExperts {
		return nil, fmt.Errorf("moe: %d experts given, the config has %d", len(w.Experts), cfg.NumExperts)
	}
	for e, x := range w.Experts {
		if err := checkExpert(x, cfg.Hidden, cfg.Inter); err != nil {
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
		return nil, fmt.Errorf("moe: shared expert gate is [%d, %d], want [1, %d]", g.Rows, g.Cols, cfg.Hidden)
	}
	return &Layer{Config: cfg, Router: router, experts: w.Experts, shared: w.Shared, sharedGate: w.SharedGate}, nil
}

func checkExpert(x Expert, hidden, inter int) error {
	for _, m := range []struct {
		name       string
		m          kernels.Matrix
		rows, cols int
	}{{"gate", x.Gate, inter, hidden}, {"up", x.Up, inter, hidden}, {"down", x.Down, hidden, inter}} {
		if m.m.Rows != m.rows || m.m.Cols != m.cols {
			return fmt.Errorf("%s projection is [%d, %d], want [%d, %d]", m.name, m.m.Rows, m.m.Cols, m.rows, m.cols)
		}
	}
	return nil
}

// Close releases the checkpoint mapping of a loaded layer.
func (l *Layer) Close() error {
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
	c := l.Config
	H, K := c.Hidden, c.TopK
	if len(x)%H != 0 {
		return fmt.Errorf("moe: input has %d values, not a multiple of hidden size %d", len(x), H)
	}
	T := len(x) / H
	if len(y) != len(x) {
		return fmt.Errorf("moe: output has %d values, want %d ([%d tokens, %d])", len(y), len(x), T, H)
	}
	if ids != nil && len(ids) != T*K || weights != nil && len(weights) != T*K {
		return fmt.Errorf("moe: routing outputs have %d ids and %d weights, want [%d tokens, top-%d] = %d", len(ids), len(weights), T, K, T*K)
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
	workers := l.workers()

	// Gate, in token chunks.
	const routeChunk = 16
	chunks := (T + routeChunk - 1) / routeChunk
	if err := kernels.Parallel(ctx, workers, chunks, func(i int) {
		l.Router.Route(x, ids, weights, i*routeChunk, min((i+1)*routeChunk, T))
	}); err != nil {
		return err
	}

	// Dispatch layout.
	lay, err := NewLayout(ids, T, K, c.NumExperts, 1)
	if err != nil {
		return err
	}
	rows := len(lay.Pairs)
	token := make([]int32, rows)
	scale := make([]float32, rows)
	for r, p := range lay.Pairs {
		token[r] = p / int32(K)
		scale[r] = weights[p]
	}

	// Grouped expert FFN, shared expert included as one more group.
	out := make([]float32, rows*H)
	var sharedOut []float32
	groups := make([]kernels.FFNGroup, 0, c.NumExperts+1)
	for e, x := range l.experts {
		lo, hi := int(lay.Offsets[e]), int(lay.Offsets[e]+lay.Counts[e])
		if hi > lo {
			groups = append(groups, kernels.FFNGroup{Gate: x.Gate, Up: x.Up, Down: x.Down,
				Rows: token[lo:hi], Scale: scale[lo:hi], Out: out[lo*H : hi*H]})
		}
	}
	if l.shared != nil {
		all := make([]int32, T)
		for t := range all {
			all[t] = int32(t)
		}
		var gate []float32
		if l.sharedGate != nil {
			gate = make([]float32, T)
			logit := make([]float64, T)
			kernels.RouterLogits(logit, x, *l.sharedGate)
			for t, v := range logit {
				gate[t] = float32(1 / (1 + math.Exp(-v)))
			}
		}
		sharedOut = make([]float32, T*H)
		s := l.shared
		groups = append(groups, kernels.FFNGroup{Gate: s.Gate, Up: s.Up, Down: s.Down, Rows: all, Scale: gate, Out: sharedOut})
	}
	if err := kernels.GroupedFFN(ctx, workers, x, groups); err != nil {
		return err
	}

	// Combine: ascending expert id, then the shared expert.
	for t := 0; t < T; t++ {
		yt := y[t*H : (t+1)*H]
		copy(yt, out[int(lay.Rows[t*K])*H:][:H])
		for j := 1; j < K; j++ {
			o := out[int(lay.Rows[t*K+j])*H:][:H]
			for i := range yt {
				yt[i] += o[i]
			}
		}
		if sharedOut != nil {
			o := sharedOut[t*H:][:H]
			for i := range yt {
				yt[i] += o[i]
			}
		}
	}
	return nil
}

// CheckFinite returns an error naming the first token of x [tokens, hidden]
// that holds a NaN or an infinity.
func CheckFinite(x []float32, hidden int) error {
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("moe: input token %d has a non-finite value %v at column %d", i/hidden, v, i%hidden)
		}
	}
	return nil
}

func (l *Layer) workers() int {
	if l.Workers > 0 {
		return l.Workers
	}
	return runtime.GOMAXPROCS(0)
}

// WeightBytesRead returns the weight bytes a forward pass with routing ids
// reads: the router, each distinct routed expert once, and the shared
// expert. Experts no token chose cost nothing.
func (l *Layer) WeightBytesRead(ids []int32) int64 {
	size := func(m kernels.Matrix) int64 { return int64(m.Rows) * int64(m.Cols) * int64(m.DType.Size()) }
	expert := func(x *Expert) int64 { return size(x.Gate) + size(x.Up) + size(x.Down) }
	n := size(l.Router.weight)
	seen := make([]bool, len(l.experts))
	for _, id := range ids {
		if id >= 0 && int(id) < len(seen) && !seen[id] {
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
func (l *Layer) WeightDType() kernels.DType { return l.experts[0].Gate.DType }
