//go:build cuda

package cudatest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
)

// Open opens GPU 0 for the test; its cleanup closes it.
func Open(t *testing.T) *cuda.Device {
	t.Helper()
	d, err := cuda.Open(0)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

// Up uploads v to d for the test; its cleanup frees the buffer.
func Up[T any](t *testing.T, d *cuda.Device, v []T) cuda.Buffer {
	t.Helper()
	b, err := cuda.Upload(d, v)
	require.NoError(t, err)
	t.Cleanup(func() { d.Free(b) })
	return b
}
