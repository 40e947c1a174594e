package kernels_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/kernels"
)

// TestReadBytes: the OR of every byte, wherever the one set byte is (the
// vector body, the word tail, the byte tail), for lengths around 512.
func TestReadBytes(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 511, 512, 513, 1024 + 13, 4096} {
		b := make([]byte, n)
		require.Zero(t, kernels.ReadBytes(b), "n=%d", n)
		for i := 0; i < n; i += max(1, n/7) {
			b[i] = 0x5A
			got := kernels.ReadBytes(b)
			require.NotZero(t, got, "n=%d, byte %d set", n, i)
			require.Equal(t, uint64(0), got&^0x5A5A5A5A5A5A5A5A, "n=%d", n)
			b[i] = 0
		}
	}
}

// TestPrefetchRows: a prefetch changes no value, and ranges outside the
// matrix (or dtypes it does not take) are ignored, never a fault.
func TestPrefetchRows(t *testing.T) {
	data := make([]uint16, 7*40)
	for i := range data {
		data[i] = uint16(i)
	}
	m, err := kernels.NewHalf(kernels.BF16, 7, 40, data)
	require.NoError(t, err)
	m.PrefetchRows(0, 7, 0, 40)
	m.PrefetchRows(6, 1, 39, 1) // the last value, its line unaligned
	m.PrefetchRows(3, 2, 5, 17)
	for _, bad := range [][4]int{{-1, 1, 0, 1}, {0, 8, 0, 1}, {0, 1, 30, 11}, {0, 1, -2, 4}, {0, 0, 0, 1}, {0, 1, 0, 0}} {
		m.PrefetchRows(bad[0], bad[1], bad[2], bad[3])
	}
	for i := range data {
		require.Equal(t, uint16(i), data[i])
	}
	q, err := kernels.Quantize(kernels.INT8, make([]float32, 4*32), 4, 32)
	require.NoError(t, err)
	q.PrefetchRows(0, 4, 0, 32)
}
