//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"

	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// MoEStep is the MoE layer's decode step for a bucket of up to Tokens
// tokens on fixed device buffers: every kernel sized for the bucket (the
// grouped GEMMs on the largest layout the bucket can route to, their blocks
// past the actual layout idle), no copy and no host synchronisation
// between them. That makes the step capturable once as a Graph and
// replayable for any routing, as SGLang replays its CUDA graphs of a decode
// batch. A batch of fewer tokens is padded with zero rows, whose outputs
// are dropped; an IDLE rank (zero tokens) replays all padding.
type MoEStep struct {
	m      *MoE
	Tokens int
	graph  Graph

	xf, xb, logits, ids, weights              Buffer
	idSorted, idExp                           Buffer
	counts, offsets, sorted, blockExp, rowsOf Buffer
	h, hb, out                                Buffer
	sw, sh, shb, so, y                        Buffer
	idRows, blocks                            int
	bs                                        buffers
}

// NewStep allocates the step's buffers for a bucket of tokens.
func (m *MoE) NewStep(tokens int) (*MoEStep, error) {
	if tokens < 1 {
		return nil, fmt.Errorf("cuda: moe step: bucket of %d tokens", tokens)
	}
	if err := m.whole(); err != nil {
		return nil, err
	}
	c, d := m.cfg, m.dev
	H, E, K, I, T := c.Hidden, c.NumExperts, c.TopK, c.Inter, tokens
	s := &MoEStep{m: m, Tokens: T, bs: buffers{d: d}}
	alloc := s.bs.alloc
	idLay, idBlocks, lerr := identityLayout(T)
	if lerr != nil {
		return nil, lerr
	}
	s.idRows = len(idLay.Pairs)
	n := T * K
	s.blocks = (n + E*(gemmBlock-1)) / gemmBlock // the padded total never needs more
	rows := s.blocks * gemmBlock
	s.xf, s.xb = alloc(int64(T*H*4)), alloc(int64(T*H*2))
	s.logits = alloc(int64(s.idRows * E * 4))
	s.ids, s.weights = alloc(int64(n*4)), alloc(int64(n*4))
	s.counts, s.offsets = alloc(int64(E*4)), alloc(int64((E+1)*4))
	s.sorted, s.blockExp, s.rowsOf = alloc(int64(rows*4)), alloc(int64(s.blocks*4)), alloc(int64(n*4))
	s.h, s.hb, s.out = alloc(int64(rows*I*4)), alloc(int64(rows*I*2)), alloc(int64(rows*H*4))
	s.y = alloc(int64(T * H * 4))
	if m.hasShared {
		S := c.SharedInter
		s.sh, s.shb, s.so = alloc(int64(s.idRows*S*4)), alloc(int64(s.idRows*S*2)), alloc(int64(s.idRows*H*4))
		if m.sharedGate != nil {
			s.sw = alloc(int64(T * 4))
		}
	}
	s.idSorted, s.idExp = s.bs.put(upload(d, idLay.Pairs)), s.bs.put(upload(d, idBlocks))
	if s.bs.err != nil {
		s.Close()
		return nil, s.bs.err
	}
	return s, nil
}

// Close frees the step's buffers and its graph.
func (s *MoEStep) Close() {
	if s.graph != nil {
		s.graph.Close()
		s.graph = nil
	}
	s.bs.free()
}

// enqueue launches the step's kernels on its buffers, on d (the device or
// a recorder of it).
func (s *MoEStep) enqueue(d Launcher) error {
	m, c := s.m, s.m.cfg
	H, E, K, I, T := c.Hidden, c.NumExperts, c.TopK, c.Inter, s.Tokens
	n, rows := T*K, s.blocks*gemmBlock
	steps := []func() error{
		func() error { return d.F32ToBF16(s.xf, s.xb, T*H) },
		func() error {
			return d.GroupedGEMM(s.xb, m.router, s.idSorted, s.idExp, s.idRows, 1, T, true, E, H, Buffer{}, s.logits)
		},
		func() error { return d.Gate(c.GateKernelArgs(), s.logits, m.bias, s.ids, s.weights, T) },
		func() error {
			return d.Align(s.ids, n, 0, E, gemmBlock, s.blocks, s.counts, s.offsets, s.sorted, s.blockExp, s.rowsOf)
		},
		func() error { return d.GroupedSwiGLU(s.xb, m.gate, m.up, s.sorted, s.blockExp, rows, K, n, I, H, s.h) },
		func() error { return d.F32ToBF16(s.h, s.hb, rows*I) },
		func() error {
			return d.GroupedGEMM(s.hb, m.down, s.sorted, s.blockExp, rows, K, n, false, H, I, s.weights, s.out)
		},
	}
	if m.hasShared {
		S := c.SharedInter
		steps = append(steps,
			func() error {
				return d.GroupedSwiGLU(s.xb, m.sGate, m.sUp, s.idSorted, s.idExp, s.idRows, 1, T, S, H, s.sh)
			},
			func() error { return d.F32ToBF16(s.sh, s.shb, s.idRows*S) },
			func() error {
				return d.GroupedGEMM(s.shb, m.sDn, s.idSorted, s.idExp, s.idRows, 1, T, false, H, S, s.sw, s.so)
			})
	}
	steps = append(steps, func() error { return d.Combine(s.out, s.rowsOf, T, K, H, s.so, s.y) })
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// Capture records the step as a Graph; later Forward calls replay it.
func (s *MoEStep) Capture() error {
	if s.graph != nil {
		return nil
	}
	g, err := s.m.dev.Capture(s.enqueue)
	if err != nil {
		return err
	}
	s.graph = g
	return nil
}

// Forward runs the step on x [t, hidden], t ≤ Tokens, into y [t, hidden]:
// the graph's replay once captured, the kernels one by one before.
func (s *MoEStep) Forward(x, y []float32) error {
	c := s.m.cfg
	H := c.Hidden
	if len(x)%H != 0 || len(y) != len(x) || len(x)/H > s.Tokens {
		return fmt.Errorf("cuda: moe step: x has %d values and y %d, want [t ≤ %d, %d]", len(x), len(y), s.Tokens, H)
	}
	if err := moe.CheckFinite(x, H); err != nil {
		return err
	}
	t := len(x) / H
	xp := make([]float32, s.Tokens*H) // zero rows pad the bucket
	copy(xp, x)
	if err := copyIn(s.m.dev, s.xf, xp); err != nil {
		return err
	}
	if s.m.sharedGate != nil {
		g := make([]float32, s.Tokens)
		logit := make([]float64, 1)
		for i := 0; i < t; i++ {
			kernels.RouterLogits(logit, x[i*H:(i+1)*H], *s.m.sharedGate)
			g[i] = float32(1 / (1 + math.Exp(-logit[0])))
		}
		if err := copyIn(s.m.dev, s.sw, g); err != nil {
			return err
		}
	}
	var err error
	if s.graph != nil {
		err = s.graph.Replay()
	} else {
		err = s.enqueue(s.m.dev)
	}
	if err != nil {
		return err
	}
	return download(s.m.dev, s.y, y)
}
