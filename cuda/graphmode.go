//go:build cuda || cudaemu

package cuda

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// GraphMode is what every device runner that replays captured graphs has
// in common: whether graphs are on (EnableGraphs), the coordinator's vote
// for the coming step (AllowGraph), how many steps ran each way and the
// first capture that failed. A runner embeds it, which makes it a
// moe.GraphVoter and a moe.GraphCounter; which shapes it captures, and
// when, is the runner's own. The zero value launches eagerly. Safe for
// concurrent use.
type GraphMode struct {
	on, allowed    atomic.Bool
	replays, eager atomic.Int64

	mu         sync.Mutex
	captureErr error
}

// EnableGraphs makes the runner capture its step shapes and replay them
// whenever the step's vote allows; eager launches otherwise. A replay gives
// the bits of the eager launches.
func (m *GraphMode) EnableGraphs() { m.on.Store(true) }

// AllowGraph is the coordinator's vote for the coming step (every rank in
// decode or idle): graphs may replay.
func (m *GraphMode) AllowGraph(ok bool) { m.allowed.Store(ok) }

// Replaying reports whether graphs are on and the step's vote allows them.
func (m *GraphMode) Replaying() bool { return m.on.Load() && m.allowed.Load() }

// GraphReplays is the number of steps replayed from a graph.
func (m *GraphMode) GraphReplays() int { return int(m.replays.Load()) }

// EagerRuns is the number of steps launched kernel by kernel.
func (m *GraphMode) EagerRuns() int { return int(m.eager.Load()) }

// CaptureErr is the first capture that failed (those steps run eagerly),
// or nil.
func (m *GraphMode) CaptureErr() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.captureErr
}

// Capture records enqueue on d as a graph of the step shape what. A
// failure, prefixed with what, is kept as CaptureErr when it is the first,
// and returned.
func (m *GraphMode) Capture(d Launcher, what string, enqueue func(rec Launcher) error) (Graph, error) {
	g, err := d.Capture(enqueue)
	if err != nil {
		if g != nil {
			g.Close()
		}
		err = fmt.Errorf("%s: %w", what, err)
		m.mu.Lock()
		if m.captureErr == nil {
			m.captureErr = err
		}
		m.mu.Unlock()
		return nil, err
	}
	return g, nil
}

// Run runs a step: g's replay when g is not nil, else enqueue on d; and
// counts which.
func (m *GraphMode) Run(ctx context.Context, d Launcher, g Graph, enqueue func(l Launcher) error) error {
	if g != nil {
		m.replays.Add(1)
		return g.Replay(ctx)
	}
	m.eager.Add(1)
	return enqueue(d)
}

// CountReplay counts a step replayed by the runner itself (one whose replay
// is more than Run's: staged inputs, say).
func (m *GraphMode) CountReplay() { m.replays.Add(1) }

// CountEager counts a step the runner launched eagerly itself.
func (m *GraphMode) CountEager() { m.eager.Add(1) }
