//go:build cuda || cudaemu

package moegpu

import (
	"context"
	"fmt"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/moe"
)

// Step is the MoE layer's decode step for a bucket of up to Tokens() tokens
// on fixed device buffers: a Stage of the bucket's size, every kernel sized
// for the largest layout the bucket can route to, no copy and no host
// synchronisation between them. That makes the step capturable once as a
// Graph and replayable for any routing, as SGLang replays its CUDA graphs
// of a decode batch. A batch of fewer tokens is padded with zero rows,
// whose outputs are dropped; an IDLE rank (zero tokens) replays all
// padding. One goroutine at a time calls it.
type Step struct {
	m      *MoE
	tokens int
	stage  *Stage
	graph  cuda.Graph
	bs     *cuda.Buffers
	host   []float32 // the padded rows, staged
}

// NewStep allocates the step's buffers for a bucket of tokens.
func (m *MoE) NewStep(tokens int) (*Step, error) {
	if tokens < 1 {
		return nil, fmt.Errorf("cuda: moe step: bucket of %d tokens", tokens)
	}
	if err := m.whole(); err != nil {
		return nil, err
	}
	s := &Step{m: m, tokens: tokens, bs: cuda.NewBuffers(m.dev)}
	var err error
	if s.stage, err = m.NewStage(s.bs, tokens, false); err != nil {
		s.bs.Free()
		return nil, err
	}
	return s, nil
}

// Tokens is the step's bucket: the most tokens a Forward takes.
func (s *Step) Tokens() int { return s.tokens }

// Close frees the step's buffers and its graph.
func (s *Step) Close() error {
	if s.graph != nil {
		s.graph.Close()
		s.graph = nil
	}
	s.bs.Free()
	return nil
}

// Capture records the step as a Graph; later Forward calls replay it.
func (s *Step) Capture() error {
	if s.graph != nil {
		return nil
	}
	g, err := s.m.dev.Capture(s.stage.Enqueue)
	if err != nil {
		return err
	}
	s.graph = g
	return nil
}

// Forward runs the step on x [t, hidden], t ≤ Tokens(), into y [t, hidden]:
// the graph's replay once captured, the kernels one by one before.
func (s *Step) Forward(ctx context.Context, x, y []float32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	H, d := s.m.cfg.Hidden, s.m.dev
	if len(x)%H != 0 || len(y) != len(x) || len(x)/H > s.tokens {
		return fmt.Errorf("cuda: moe step: x has %d values and y %d, want [t ≤ %d, %d]", len(x), len(y), s.tokens, H)
	}
	if err := moe.CheckFinite(x, H); err != nil {
		return err
	}
	if s.host == nil {
		s.host = make([]float32, s.tokens*H)
	}
	copy(s.host, x)
	clear(s.host[len(x):]) // zero rows pad the bucket
	if err := cuda.CopyIn(d, s.stage.in, s.host); err != nil {
		return err
	}
	if err := s.m.sharedScale(s.stage.shared, x); err != nil {
		return err
	}
	var err error
	if s.graph != nil {
		err = s.graph.Replay(ctx)
	} else {
		err = s.stage.Enqueue(d)
	}
	if err != nil {
		return err
	}
	return cuda.Download(d, s.stage.out, y)
}
