//go:build cudaemu

package cuda_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/internal/half"
)

// TestGraphMode: the switches, the counts, and the first failed capture
// kept with the step's name.
func TestGraphMode(t *testing.T) {
	ctx := context.Background()
	e := cuda.NewEmu()
	var m cuda.GraphMode
	require.False(t, m.Replaying(), "the zero value launches eagerly")
	m.AllowGraph(true)
	require.False(t, m.Replaying(), "a vote alone does not turn graphs on")
	m.EnableGraphs()
	require.True(t, m.Replaying())
	m.AllowGraph(false)
	require.False(t, m.Replaying())

	x := []float32{1.5, -2, 0.25, 8} // exact in bf16
	src, err := cuda.Upload(e, x)
	require.NoError(t, err)
	defer e.Free(src)
	dst, err := cuda.Upload(e, make([]uint16, len(x)))
	require.NoError(t, err)
	defer e.Free(dst)
	enqueue := func(l cuda.Launcher) error { return l.F32ToBF16(src, dst, len(x)) }

	boom := errors.New("no memory")
	g, err := m.Capture(e, "step A", func(cuda.Launcher) error { return boom })
	require.Nil(t, g)
	require.ErrorIs(t, err, boom)
	require.EqualError(t, m.CaptureErr(), "step A: no memory")
	_, err = m.Capture(e, "step B", func(cuda.Launcher) error { return errors.New("other") })
	require.Error(t, err)
	require.EqualError(t, m.CaptureErr(), "step A: no memory", "the first failure stays")

	g, err = m.Capture(e, "step C", enqueue)
	require.NoError(t, err)
	defer g.Close()
	require.NoError(t, m.Run(ctx, e, nil, enqueue))
	require.NoError(t, m.Run(ctx, e, g, enqueue))
	require.NoError(t, m.Run(ctx, e, g, enqueue))
	require.Equal(t, 2, m.GraphReplays())
	require.Equal(t, 1, m.EagerRuns())
	got := make([]uint16, len(x))
	require.NoError(t, cuda.Download(e, dst, got))
	for i, v := range got {
		require.Equal(t, x[i], half.BF16ToF32(v))
	}
}
