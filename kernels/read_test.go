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
