package ep

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// WithTimeout returns c with every collective bounded by d: a call that
// has not completed d after it began (a rank did not arrive, or its
// transfer stalled) fails with an error naming the rank, the collective
// and d, wrapping context.DeadlineExceeded, and aborts the group so that
// the other ranks fail at once rather than at their own deadlines. The
// caller's context still ends a call earlier. d ≤ 0 returns c.
func WithTimeout(c Comm, d time.Duration) Comm {
	if d <= 0 {
		return c
	}
	return &timeoutComm{Comm: c, d: d}
}

type timeoutComm struct {
	Comm
	d time.Duration
}

// call runs f under the collective's deadline.
func (t *timeoutComm) call(ctx context.Context, what string, f func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, t.d)
	defer cancel()
	err := f(cctx)
	if err != nil && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("ep: rank %d: %s did not complete within %v (--timeout): a rank did not arrive: %w", t.Rank(), what, t.d, context.DeadlineExceeded)
		t.Abort(err)
	}
	return err
}

func (t *timeoutComm) AllGather(ctx context.Context, send []byte) (out [][]byte, err error) {
	err = t.call(ctx, "AllGather", func(ctx context.Context) error {
		out, err = t.Comm.AllGather(ctx, send)
		return err
	})
	return out, err
}

func (t *timeoutComm) AllToAllV(ctx context.Context, send [][]byte) (out [][]byte, err error) {
	err = t.call(ctx, "AllToAllV", func(ctx context.Context) error {
		out, err = t.Comm.AllToAllV(ctx, send)
		return err
	})
	return out, err
}

func (t *timeoutComm) AllReduceInt64(ctx context.Context, v []int64, op Op) error {
	return t.call(ctx, "AllReduceInt64", func(ctx context.Context) error { return t.Comm.AllReduceInt64(ctx, v, op) })
}

func (t *timeoutComm) AllReduceFloat32(ctx context.Context, v []float32, op Op) error {
	return t.call(ctx, "AllReduceFloat32", func(ctx context.Context) error { return t.Comm.AllReduceFloat32(ctx, v, op) })
}

func (t *timeoutComm) ReduceScatter(ctx context.Context, v []float32, counts []int) (out []float32, err error) {
	err = t.call(ctx, "ReduceScatter", func(ctx context.Context) error {
		out, err = t.Comm.ReduceScatter(ctx, v, counts)
		return err
	})
	return out, err
}

func (t *timeoutComm) Barrier(ctx context.Context) error {
	return t.call(ctx, "Barrier", t.Comm.Barrier)
}
