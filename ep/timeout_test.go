package ep_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/moex-project/moex/ep"
	"github.com/stretchr/testify/require"
)

// TestWithTimeout: a rank that never arrives fails the others' collective
// after the timeout, naming it, and aborts the group; a slow but healthy
// run longer than the timeout in total succeeds, each call being bounded,
// not the run.
func TestWithTimeout(t *testing.T) {
	comms, err := ep.NewLocal(2)
	require.NoError(t, err)
	c0 := ep.WithTimeout(comms[0], 50*time.Millisecond)
	start := time.Now()
	err = c0.Barrier(context.Background()) // rank 1 never comes
	require.ErrorContains(t, err, "ep: rank 0: Barrier did not complete within 50ms (--timeout): a rank did not arrive")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 5*time.Second)
	err = comms[1].Barrier(context.Background()) // the group is broken: fails at once
	require.ErrorIs(t, err, ep.ErrAborted)

	// Healthy: 6 barriers 20 ms apart (120 ms in all) under a 100 ms bound per call.
	errs, err := ep.RunLocal(2, func(c ep.Comm) error {
		c = ep.WithTimeout(c, 100*time.Millisecond)
		for i := 0; i < 6; i++ {
			time.Sleep(20 * time.Millisecond)
			if err := c.Barrier(context.Background()); err != nil {
				return err
			}
			v := []int64{int64(c.Rank())}
			if err := c.AllReduceInt64(context.Background(), v, ep.Sum); err != nil {
				return err
			}
			if v[0] != 1 {
				return errors.New("wrong sum")
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []error{nil, nil}, errs)

	// The caller's context still wins, unwrapped.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	comms, err = ep.NewLocal(2)
	require.NoError(t, err)
	err = ep.WithTimeout(comms[0], time.Hour).Barrier(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.Same(t, comms[0], ep.WithTimeout(comms[0], 0), "no bound")
}
