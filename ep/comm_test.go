package ep_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/ep/eptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// onRanks runs f on n in-process ranks at once and returns their errors.
func onRanks(t *testing.T, n int, f func(c ep.Comm) error) []error {
	t.Helper()
	errs, err := ep.RunLocal(n, f)
	require.NoError(t, err)
	return errs
}

func TestCollectives(t *testing.T) {
	for _, n := range []int{1, 3, 4} {
		eptest.Collectives(t, n, func(n int, f func(c ep.Comm) error) []error { return onRanks(t, n, f) })
	}
}

func TestMissingRankTimesOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs := onRanks(t, 3, func(c ep.Comm) error {
		if c.Rank() == 2 {
			return nil // never arrives
		}
		return c.Barrier(ctx)
	})
	require.Less(t, time.Since(start), 2*time.Second)
	require.ErrorContains(t, errs[0], "ranks [2] did not arrive")
	require.ErrorIs(t, errs[0], context.DeadlineExceeded)
	require.Error(t, errs[1])
}

func TestFailingRankBreaksTheGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	errs := onRanks(t, 4, func(c ep.Comm) error {
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if c.Rank() == 1 {
			err := errors.New("out of memory")
			c.Abort(err)
			return err
		}
		_, err := c.AllGather(ctx, []byte{1})
		return err
	})
	require.Less(t, time.Since(start), 2*time.Second, "the others must not wait for the deadline")
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		if r != 1 {
			require.ErrorIs(t, err, ep.ErrAborted)
			require.ErrorContains(t, err, "out of memory")
		}
	}
}

func TestCancelledMidCollective(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	errs := onRanks(t, 3, func(c ep.Comm) error {
		if c.Rank() == 0 {
			time.Sleep(50 * time.Millisecond)
			cancel()
			return nil
		}
		_, err := c.AllToAllV(ctx, [][]byte{{1}, {2}, {3}})
		return err
	})
	require.ErrorIs(t, errs[1], context.Canceled)
	require.Error(t, errs[2])
}

func TestMismatchedCalls(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := onRanks(t, 2, func(c ep.Comm) error {
		if c.Rank() == 0 {
			_, err := c.AllGather(ctx, nil)
			return err
		}
		return c.Barrier(ctx)
	})
	require.ErrorContains(t, errs[0], "rank 0 called AllGather, rank 1 called Barrier")
	require.ErrorContains(t, errs[1], "rank 0 called AllGather, rank 1 called Barrier")

	errs = onRanks(t, 2, func(c ep.Comm) error {
		return c.AllReduceInt64(ctx, make([]int64, 2+c.Rank()), ep.Sum)
	})
	require.ErrorContains(t, errs[1], "AllReduceInt64: rank 1 passed 3 values, rank 0 passed 2")

	errs = onRanks(t, 2, func(c ep.Comm) error {
		counts := []int{1, 2}
		if c.Rank() == 1 {
			counts = []int{2, 1}
		}
		_, err := c.ReduceScatter(ctx, make([]float32, 3), counts)
		return err
	})
	require.ErrorContains(t, errs[0], "rank 1 passed counts [2 1], rank 0 passed [1 2]")

	errs = onRanks(t, 2, func(c ep.Comm) error {
		_, err := c.ReduceScatter(ctx, make([]float32, 4), []int{1, 2})
		return err
	})
	require.ErrorContains(t, errs[0], "counts [1 2] add up to 3, the buffer holds 4")

	errs = onRanks(t, 2, func(c ep.Comm) error {
		_, err := c.AllToAllV(ctx, [][]byte{{1}})
		return err
	})
	require.ErrorContains(t, errs[0], "1 send buffers for 2 ranks")
	require.Error(t, errs[1])
}
