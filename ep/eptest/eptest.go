// Package eptest is the conformance suite of ep.Comm implementations:
// every transport (in-process, MPI, NCCL) runs the same collectives with
// the same checks.
package eptest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/ep"
)

// Ranks runs f on n ranks of the transport under test at once and returns
// their errors.
type Ranks func(n int, f func(c ep.Comm) error) []error

// Collectives checks every collective of ep.Comm on n ranks: variable
// all-gather and all-to-all (sizes differing by rank), int64 and float32
// all-reduce with each reduction, reduce-scatter with variable counts (the
// input kept), and a barrier.
func Collectives(t *testing.T, n int, run Ranks) {
	ctx := context.Background()
	errs := run(n, func(c ep.Comm) error {
		r := c.Rank()
		// Variable-size all-gather.
		send := make([]byte, r+1)
		for i := range send {
			send[i] = byte(10*r + i)
		}
		got, err := c.AllGather(ctx, send)
		if err != nil {
			return err
		}
		for s, b := range got {
			require.Len(t, b, s+1)
			require.Equal(t, byte(10*s), b[0])
		}
		// All-to-all: rank r sends r·n+d to rank d, as many bytes as d+1.
		out := make([][]byte, n)
		for d := range out {
			out[d] = make([]byte, d+1)
			for i := range out[d] {
				out[d][i] = byte(r*n + d)
			}
		}
		in, err := c.AllToAllV(ctx, out)
		if err != nil {
			return err
		}
		for s, b := range in {
			require.Len(t, b, r+1)
			require.Equal(t, byte(s*n+r), b[0])
		}
		// Reductions.
		iv := []int64{int64(r), int64(-r), 7}
		if err := c.AllReduceInt64(ctx, iv, ep.Sum); err != nil {
			return err
		}
		require.Equal(t, []int64{int64(n * (n - 1) / 2), int64(-n * (n - 1) / 2), int64(7 * n)}, iv)
		fv := []float32{float32(r), float32(-r)}
		if err := c.AllReduceFloat32(ctx, fv, ep.Max); err != nil {
			return err
		}
		require.Equal(t, []float32{float32(n - 1), 0}, fv)
		mv := []int64{int64(r + 3)}
		if err := c.AllReduceInt64(ctx, mv, ep.Min); err != nil {
			return err
		}
		require.Equal(t, []int64{3}, mv)
		// Reduce-scatter with variable counts: rank d gets d+1 values.
		counts := make([]int, n)
		total := 0
		for d := range counts {
			counts[d] = d + 1
			total += d + 1
		}
		v := make([]float32, total)
		for i := range v {
			v[i] = float32(i * (r + 1))
		}
		seg, err := c.ReduceScatter(ctx, v, counts)
		if err != nil {
			return err
		}
		lo := r * (r + 1) / 2
		for i, x := range seg {
			require.Equal(t, float32((lo+i)*n*(n+1)/2), x)
		}
		require.Equal(t, float32(total-1)*float32(r+1), v[total-1], "input kept")
		return c.Barrier(ctx)
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
}
