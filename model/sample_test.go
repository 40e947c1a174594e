package model_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/model"
)

func TestSampler(t *testing.T) {
	logits := []float32{1, 3, 3, 0, 2.5}
	g, err := model.NewSampler(model.Sampling{TopP: 1})
	require.NoError(t, err)
	require.EqualValues(t, 1, g.Next(logits), "greedy: the first highest")

	// Temperature 1 over all: frequencies follow softmax(logits).
	s, err := model.NewSampler(model.Sampling{Temperature: 1, TopP: 1, Seed: 7})
	require.NoError(t, err)
	const n = 200000
	counts := make([]float64, len(logits))
	for range n {
		counts[s.Next(logits)]++
	}
	var z float64
	for _, v := range logits {
		z += math.Exp(float64(v))
	}
	for i, v := range logits {
		require.InDelta(t, math.Exp(float64(v))/z, counts[i]/n, 0.005, "token %d", i)
	}

	// top_p 0.75: 3, 3 hold 2·e³/z ≈ 0.716 < 0.75, so 2.5 joins; 1 and 0 never.
	s, err = model.NewSampler(model.Sampling{Temperature: 1, TopP: 0.75, Seed: 8})
	require.NoError(t, err)
	clear(counts)
	for range n {
		counts[s.Next(logits)]++
	}
	require.Zero(t, counts[0])
	require.Zero(t, counts[3])
	kept := 2*math.Exp(3) + math.Exp(2.5)
	require.InDelta(t, math.Exp(2.5)/kept, counts[4]/n, 0.005)

	// top_p 0.7: the two 3s alone reach it.
	s, err = model.NewSampler(model.Sampling{Temperature: 1, TopP: 0.7, Seed: 10})
	require.NoError(t, err)
	for range 1000 {
		require.Contains(t, []int32{1, 2}, s.Next(logits))
	}

	// top_k 2: only the two 3s, evenly.
	s, err = model.NewSampler(model.Sampling{Temperature: 0.5, TopP: 1, TopK: 2, Seed: 9})
	require.NoError(t, err)
	clear(counts)
	for range n {
		counts[s.Next(logits)]++
	}
	require.Equal(t, float64(n), counts[1]+counts[2])
	require.InDelta(t, 0.5, counts[1]/n, 0.005)

	// The same seed, the same tokens.
	a, _ := model.NewSampler(model.Sampling{Temperature: 0.8, TopP: 0.9, Seed: 3})
	b, _ := model.NewSampler(model.Sampling{Temperature: 0.8, TopP: 0.9, Seed: 3})
	for range 100 {
		require.Equal(t, a.Next(logits), b.Next(logits))
	}

	for _, tt := range []struct {
		s    model.Sampling
		want string
	}{
		{model.Sampling{Temperature: -1, TopP: 1}, "temperature -1 must be a finite number ≥ 0"},
		{model.Sampling{Temperature: math.NaN(), TopP: 1}, "temperature NaN"},
		{model.Sampling{TopP: 0}, "top_p 0 must be in (0, 1]"},
		{model.Sampling{TopP: 1.5}, "top_p 1.5 must be in (0, 1]"},
		{model.Sampling{TopP: 1, TopK: -2}, "top_k -2 must be ≥ 0"},
	} {
		_, err := model.NewSampler(tt.s)
		require.ErrorContains(t, err, tt.want)
	}
}
