package ep_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/ep"
)

func TestStaticPlacements(t *testing.T) {
	p, err := ep.Contiguous(10, 4)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 2}, p.Local(0))
	require.Equal(t, []int{3, 4, 5}, p.Local(1))
	require.Equal(t, []int{6, 7}, p.Local(2))
	require.Equal(t, []int{8, 9}, p.Local(3))
	require.InDelta(t, 1.2, p.PredictedImbalance, 1e-9)

	p, err = ep.Contiguous(3, 5) // more ranks than experts
	require.NoError(t, err)
	require.Equal(t, []int{2}, p.Local(2))
	require.Empty(t, p.Local(4))

	p, err = ep.RoundRobin(10, 4)
	require.NoError(t, err)
	require.Equal(t, []int{1, 5, 9}, p.Local(1))
	require.Equal(t, 3, p.Dest(7, 12345))
}

func TestBalancedPlacement(t *testing.T) {
	// Zipf-like popularity over 64 experts, 8 ranks.
	load := make([]int64, 64)
	rng := rand.New(rand.NewPCG(1, 2))
	perm := rng.Perm(64)
	for i, e := range perm {
		load[e] = int64(100000 / math.Pow(float64(i+1), 1.1))
	}
	cont, err := ep.Contiguous(64, 8)
	require.NoError(t, err)
	bal, err := ep.Balanced(load, 8, 8)
	require.NoError(t, err)
	ci, bi := cont.Imbalance(load), bal.Imbalance(load)
	t.Logf("zipf(1.1) load, 64 experts, 8 ranks, 8 redundant slots: imbalance contiguous %.2f, balanced %.2f", ci, bi)
	require.Less(t, bi, 1.3)
	require.Less(t, bi, ci/2)
	require.InDelta(t, bi, bal.PredictedImbalance, 1e-12)
	require.Equal(t, 9, bal.SlotsPerRank)
	// The hottest expert got more than one replica, on distinct ranks.
	hot := perm[0]
	require.Greater(t, len(bal.Replicas[hot]), 1)
	// Tokens of a replicated expert are split over its replicas, deterministically.
	seen := map[int]bool{}
	for tok := 0; tok < 16; tok++ {
		seen[bal.Dest(hot, tok)] = true
		require.Equal(t, bal.Dest(hot, tok), bal.Dest(hot, tok))
	}
	require.Len(t, seen, len(bal.Replicas[hot]))

	// JSON round trip.
	data, err := json.Marshal(bal)
	require.NoError(t, err)
	back, err := ep.ParsePlacement(data)
	require.NoError(t, err)
	require.Equal(t, bal, back)

	// More redundancy than useful is capped; one rank holds everything.
	one, err := ep.Balanced(load, 1, 10)
	require.NoError(t, err)
	require.Equal(t, 1.0, one.PredictedImbalance)
}

func TestPlacementErrors(t *testing.T) {
	_, err := ep.Contiguous(0, 2)
	require.Error(t, err)
	_, err = ep.Balanced([]int64{1, -1}, 2, 0)
	require.ErrorContains(t, err, "expert 1 has negative load -1")
	bad := []struct {
		name, json, err string
	}{
		{"expert on a rank out of range", `{"num_experts":2,"ranks":2,"slots_per_rank":2,"replicas":[[0],[2]]}`, "expert 1 is on rank 2, out of range [0, 2)"},
		{"expert without owner", `{"num_experts":2,"ranks":2,"slots_per_rank":2,"replicas":[[0],[]]}`, "expert 1 has no owner"},
		{"rank over its slots", `{"num_experts":3,"ranks":2,"slots_per_rank":1,"replicas":[[0],[0],[1]]}`, "rank 0 holds 2 experts, more than its 1 slots"},
		{"duplicate replica", `{"num_experts":1,"ranks":2,"slots_per_rank":1,"replicas":[[1,1]]}`, "not ascending and distinct"},
		{"wrong expert count", `{"num_experts":3,"ranks":2,"slots_per_rank":2,"replicas":[[0],[1]]}`, "lists 2 experts"},
		{"not JSON", `{`, "placement"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ep.ParsePlacement([]byte(tt.json))
			require.ErrorContains(t, err, tt.err)
		})
	}
}

func TestSplit(t *testing.T) {
	require.Equal(t, []int{0, 3, 6, 8, 10}, ep.Split(10, 4))
	require.Equal(t, []int{0, 1, 2, 2, 2}, ep.Split(2, 4))
}
