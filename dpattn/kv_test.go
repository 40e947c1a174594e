package dpattn_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

func TestAccount(t *testing.T) {
	// DeepSeek-V2-Lite: 27 layers, 512 + 64 latent dims, bf16; 4 ranks with 10 GiB of KV each.
	a, err := dpattn.Account(4, 27, 576, 2, 10<<30)
	require.NoError(t, err)
	require.EqualValues(t, 27*576*2, a.BytesPerToken)
	require.EqualValues(t, 31104, a.PerRankTP)
	require.EqualValues(t, 7776, a.PerRankDP)
	require.EqualValues(t, (10<<30)/31104, a.MaxTokensTP)
	require.EqualValues(t, 4*((10<<30)/31104), a.MaxTokensDP)
	require.InDelta(t, 4.0, a.DPOverTPFactor, 1e-12)
	require.Contains(t, a.String(), "DP attention 7776 B/token/rank")
	_, err = dpattn.Account(4, 27, 576, 2, 1000)
	require.EqualError(t, err, "dpattn: a KV budget of 1000 B per rank holds no token (31104 B each: 27 layers × 576 values × 2 B)")
	_, err = dpattn.Account(0, 27, 576, 2, 1)
	require.Error(t, err)
}

// TestCacheSizeCheckedFirst: a cache too large for the machine is refused,
// naming its size, before it is allocated.
func TestCacheSizeCheckedFirst(t *testing.T) {
	_, err := dpattn.NewLatentCache(1<<30, 64, 576, kernels.BF16)
	require.ErrorContains(t, err, "dpattn: a latent cache of 1073741824 blocks × 64 rows × 576 values needs 73740.0 GiB, more than the ")
	require.ErrorIs(t, err, moe.ErrTooLarge)
	_, err = dpattn.NewLatentCache(4, 2, 4, kernels.F16)
	require.EqualError(t, err, "dpattn: cache dtype F16 (want F32 or BF16)")
}
