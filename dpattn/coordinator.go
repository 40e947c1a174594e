package dpattn

import (
	"context"
	"fmt"

	"github.com/moex-project/moex/ep"
)

// Mode is the kind of batch a rank runs in a step.
type Mode uint8

// Batch modes.
const (
	Decode Mode = iota + 1 // one new token per request
	Extend                 // several new tokens per request (prefill)
)

// StepPlan is what every rank agrees on before a step.
type StepPlan struct {
	Counts []int64 // tokens of every rank this step (decode: batch size; extend: new tokens)
	Total  int     // sum of Counts
	Offset int     // this rank's first token in the global order
	Tokens int     // this rank's tokens
	// Idle: this rank has nothing to do but others do; it runs an IDLE batch
	// of zero tokens so that it still joins the step's collectives.
	Idle bool
	// Skip: no rank has anything to do; every rank skips the step.
	Skip bool
	// GraphOK: every rank runs decode or idle, so the step may replay a
	// captured graph.
	GraphOK bool
}

// Coordinator plans each step of data-parallel attention over a group of
// ranks (SGLang's prepare_dp_attn_batch): the token counts, the IDLE
// batches and the graph-replay vote.
type Coordinator struct {
	comm ep.Comm
}

// NewCoordinator coordinates the ranks of comm.
func NewCoordinator(comm ep.Comm) *Coordinator { return &Coordinator{comm: comm} }

// Plan all-gathers this rank's token count, marks the rank idle when it
// has none while others have some (or skips the step when no rank has
// any), and all-reduces (MIN) "decode or idle" into the graph vote. Every
// rank must call Plan each step; one that does not makes the others fail
// at the context's deadline.
func (c *Coordinator) Plan(ctx context.Context, tokens int, mode Mode) (*StepPlan, error) {
	if tokens < 0 {
		return nil, fmt.Errorf("dpattn: plan: %d tokens", tokens)
	}
	if mode != Decode && mode != Extend {
		return nil, fmt.Errorf("dpattn: plan: unknown mode %d", mode)
	}
	counts, err := ep.AllGatherInt64(ctx, c.comm, int64(tokens))
	if err != nil {
		return nil, err
	}
	p := &StepPlan{Counts: counts, Tokens: tokens}
	for r, n := range counts {
		if r < c.comm.Rank() {
			p.Offset += int(n)
		}
		p.Total += int(n)
	}
	if p.Total == 0 {
		p.Skip = true
		return p, nil
	}
	p.Idle = tokens == 0
	vote := []int64{0}
	if mode == Decode || p.Idle {
		vote[0] = 1
	}
	if err := c.comm.AllReduceInt64(ctx, vote, ep.Min); err != nil {
		return nil, err
	}
	p.GraphOK = vote[0] == 1
	return p, nil
}
