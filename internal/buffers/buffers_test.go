package buffers_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/buffers"
)

func TestGrow(t *testing.T) {
	var buf []float32
	a := buffers.Grow(&buf, 8)
	require.Len(t, a, 8)
	require.Equal(t, 10, cap(buf), "a quarter to spare")
	a[0] = 7
	b := buffers.Grow(&buf, 4)
	require.Len(t, b, 4)
	require.Equal(t, float32(7), b[0], "a smaller request reuses the buffer")
	c := buffers.Grow(&buf, 100)
	require.Len(t, c, 100)
	require.GreaterOrEqual(t, cap(buf), 100)
}
