//go:build cuda || cudaemu

package moegpu

import (
	"context"
	"fmt"
	"sync"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// MoE is a MoE layer on a device: its router and experts resident as bf16
// (the experts stacked [E, N, K] for the grouped GEMMs), run by the device
// pipeline (route, layout, grouped FFN, combine) of kernels/cuda.
type MoE struct {
	dev          cuda.Launcher
	cfg          *moe.Config
	router, bias cuda.Buffer
	logitBias    cuda.Buffer // [experts]: added to the router logits (gpt_oss), or none
	routed       stack       // the experts held: all, or a contiguous shard for gather mode
	shared       *stack      // nil without a shared expert
	sharedGate   *kernels.Matrix
	bs           *cuda.Buffers     // the weights
	tmp          *cuda.ScratchPool // Forward's temporaries, kept between calls
	life         sync.RWMutex      // Forward holds it shared, Close exclusive
	closed       bool
}

// NewMoE uploads the layer's weights as bf16. The layer holds every expert
// (Forward, NewStep) or, for gather mode's partial stage, a contiguous
// shard of them (as ep.Contiguous places them); hidden and the
// intermediate sizes must be multiples of 16. On error nothing stays on
// the device.
func NewMoE(dev cuda.Launcher, l *moe.Layer) (*MoE, error) {
	c := l.Config
	if err := checkRouting(l); err != nil {
		return nil, err
	}
	if c.Hidden%16 != 0 || c.Inter%16 != 0 || c.SharedInter%16 != 0 {
		return nil, fmt.Errorf("cuda: moe: hidden %d and intermediate sizes %d, %d must be multiples of 16", c.Hidden, c.Inter, c.SharedInter)
	}
	lo, local := -1, 0
	var experts []moe.Expert
	for e := 0; e < c.NumExperts; e++ {
		x, ok := l.Expert(e)
		if !ok {
			continue
		}
		if lo < 0 {
			lo = e
		} else if e != lo+local {
			return nil, fmt.Errorf("cuda: moe: the layer holds experts %d and %d but not those between (a device shard is contiguous)",
				lo+local-1, e)
		}
		local++
		experts = append(experts, x)
	}
	if local == 0 {
		return nil, fmt.Errorf("cuda: moe: the layer holds no expert")
	}
	m := &MoE{dev: dev, cfg: c, bs: cuda.NewBuffers(dev), tmp: cuda.NewScratchPool(dev)}
	m.router = m.bs.Put(cuda.Upload(dev, cuda.BF16Rows(l.Router.Weight())))
	if b := l.Router.Bias(); b != nil {
		m.bias = m.bs.Put(cuda.Upload(dev, b))
	}
	if b := l.Router.LogitBias(); b != nil {
		m.logitBias = m.bs.Put(cuda.Upload(dev, b))
	}
	m.routed = uploadStack(m.bs, experts, lo, c.Hidden, c.Inter, c.Act, c.WeightOnInput)
	if s, g := l.SharedExpert(); s != nil {
		st := uploadStack(m.bs, []moe.Expert{*s}, 0, c.Hidden, s.Gate.Rows, c.SharedAct, false)
		m.shared, m.sharedGate = &st, g
	}
	if err := m.bs.Err(); err != nil {
		m.bs.Free()
		return nil, err
	}
	return m, nil
}

// Config is the layer's config.
func (m *MoE) Config() *moe.Config { return m.cfg }

// Device is the device holding the weights.
func (m *MoE) Device() cuda.Launcher { return m.dev }

// Experts is the range of experts held: lo … lo+n-1.
func (m *MoE) Experts() (lo, n int) { return m.routed.lo, m.routed.n }

// HostSharedGate reports whether the layer's shared expert has a gate
// computed on the host (qwen2_moe's), which a stage needs staged with
// each step's rows.
func (m *MoE) HostSharedGate() bool { return m.sharedGate != nil }

// Close frees the weights and the temporaries once the Forward calls in
// flight are done; later ones return moe.ErrClosed. Steps and stages made
// from m must be closed first. A second Close does nothing.
func (m *MoE) Close() error {
	m.life.Lock()
	defer m.life.Unlock()
	m.closed = true
	m.bs.Free()
	m.tmp.Free()
	return nil
}

// whole reports an error unless m holds every expert.
func (m *MoE) whole() error {
	if m.routed.n != m.cfg.NumExperts {
		return fmt.Errorf("cuda: moe: the layer holds experts %d…%d of %d: a shard runs in a partial Stage (gather mode)",
			m.routed.lo, m.routed.lo+m.routed.n-1, m.cfg.NumExperts)
	}
	return nil
}

// Forward computes y = MoE(x), x and y [tokens, hidden] on the host, with
// activations rounded to bf16 on the device (tensor-core numerics: within
// about 1e-2 of the fp32 CPU path). Its device temporaries are kept from
// call to call (one set per concurrent caller).
func (m *MoE) Forward(ctx context.Context, x, y []float32) error {
	return m.ForwardRouting(ctx, x, y, nil, nil)
}

// ForwardRouting is Forward that also returns each token's experts
// (ascending) and their routing weights, ids and weights [tokens, top_k];
// either may be nil.
func (m *MoE) ForwardRouting(ctx context.Context, x, y []float32, ids []int32, weights []float32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.life.RLock()
	defer m.life.RUnlock()
	if m.closed {
		return errkind.Errorf(moe.ErrClosed, "cuda: moe: forward on a closed layer")
	}
	if err := m.whole(); err != nil {
		return err
	}
	c, d := m.cfg, m.dev
	H, K := c.Hidden, c.TopK
	if len(x)%H != 0 || len(y) != len(x) {
		return fmt.Errorf("cuda: moe: x has %d values and y %d, want [tokens, %d]", len(x), len(y), H)
	}
	if n := len(x) / H * K; (ids != nil && len(ids) != n) || (weights != nil && len(weights) != n) {
		return fmt.Errorf("cuda: moe: ids has %d values and weights %d, want [%d tokens, top_k %d]", len(ids), len(weights), len(x)/H, K)
	}
	if err := moe.CheckFinite(x, H); err != nil {
		return err
	}
	T := len(x) / H
	if T == 0 {
		return nil
	}
	sc := m.tmp.Get()
	defer m.tmp.Put(sc)
	s, err := m.NewStage(cuda.NewScratchAlloc(sc), T, false)
	if err != nil {
		return err
	}
	if err := cuda.CopyIn(d, s.in, x); err != nil {
		return err
	}
	if err := m.sharedScale(s.shared, x); err != nil {
		return err
	}
	if err := s.Enqueue(d); err != nil {
		return err
	}
	if ids != nil {
		if err := cuda.Download(d, s.ids, ids); err != nil {
			return err
		}
	}
	if weights != nil {
		if err := cuda.Download(d, s.weights, weights); err != nil {
			return err
		}
	}
	return cuda.Download(d, s.out, y)
}

// checkRouting refuses a layer whose router or block the device pipeline
// does not compute yet: one that chooses its experts by token id
// (deepseek_v4's hash layers) or owns its norms (gemma4). Those run their
// experts on the device through Experts, the router on the CPU.
func checkRouting(l *moe.Layer) error {
	if c := l.Config; c.ResidualInput || l.TokenRouted() {
		return errkind.Errorf(moe.ErrUnsupportedFormat, "cuda: %s layers that own their norms or choose their experts by token id do not route on the device yet: run the router on the CPU (moegpu.Experts)", c.ModelType)
	}
	return nil
}
