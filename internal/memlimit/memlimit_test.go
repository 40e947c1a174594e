package memlimit

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheck(t *testing.T) {
	require.Greater(t, Machine(), uint64(1<<20))
	require.NoError(t, Check("a buffer", 1<<20))
	err := Check("a buffer", math.Ldexp(1, 70))
	require.ErrorIs(t, err, ErrTooLarge)
	require.ErrorContains(t, err, "a buffer needs 1099511627776.0 GiB, more than the ")
	require.ErrorContains(t, err, "of the machine's memory")
	require.ErrorIs(t, Check("NaN bytes", math.NaN()), ErrTooLarge)

	defer Set(Set(3 << 30))
	require.Equal(t, uint64(3<<30), Limit())
	require.NoError(t, Check("two", 2<<30))
	require.EqualError(t, Check("four", 4<<30), "four needs 4.0 GiB, more than the 3.0 GiB of the limit set: over the memory limit")
}
