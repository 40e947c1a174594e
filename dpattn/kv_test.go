package dpattn_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/dpattn"
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
