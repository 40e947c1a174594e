//go:build cgo

package nccl

import (
	"context"
	"fmt"
	"time"
)

// Await waits for this rank's enqueued NCCL work, which done reports
// finished (typically cudaStreamQuery on the collective's stream). It polls
// done and the communicator's asynchronous error; when that error is set,
// or when ctx ends first (a peer that never joins the collective), it
// aborts the communicator, NCCL's only way out of a collective that cannot
// complete, and returns the reason. After an abort the communicator is
// gone: make a new one.
func (c *Comm) Await(ctx context.Context, done func() (bool, error)) error {
	err := poll(ctx, func() (bool, error) {
		// NCCL first: a non-blocking communicator still queuing its work
		// (ncclInProgress) leaves the stream idle before the work is on it.
		if queued, err := c.queued(); err != nil || !queued {
			return false, err
		}
		ok, err := done()
		if err != nil {
			return false, err // the work may be stuck: do not leave it to Destroy
		}
		return ok, nil
	})
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("nccl: rank %d: collective not finished: %w", c.rank, context.Cause(ctx))
	}
	if err != nil {
		return c.abortWith(err)
	}
	return nil
}

// Queued waits until NCCL has queued this rank's last call on a
// non-blocking communicator (its state is no longer ncclInProgress): what
// must come before the next NCCL call, and all that can be waited for
// while a stream is being captured into a CUDA graph (a capturing stream
// may not be queried). A blocking communicator has queued its work when
// the call returns. On an asynchronous error, or at ctx's end, it aborts
// the communicator.
func (c *Comm) Queued(ctx context.Context) error {
	if err := c.WaitQueued(ctx); err != nil {
		return c.abortWith(err)
	}
	return nil
}

// WaitQueued is Queued without the abort: for a caller that cannot abort
// where it is (inside a stream capture, whose thread may not synchronise)
// and aborts once out of it.
func (c *Comm) WaitQueued(ctx context.Context) error {
	if !c.nonblocking {
		return nil
	}
	err := poll(ctx, c.queued)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("nccl: rank %d: collective not queued: %w", c.rank, context.Cause(ctx))
	}
	return err
}

// queued asks NCCL once whether its last call is queued (not
// ncclInProgress), and for an asynchronous error.
func (c *Comm) queued() (bool, error) {
	state, err := c.asyncState()
	switch {
	case err != nil:
		return false, err
	case state == inProgress:
		return false, nil
	}
	return true, resultError("asynchronous operation", state)
}

// poll calls check, backing off from 10µs to 1ms between calls, until it
// reports done or an error, or ctx ends (its error is returned then).
func poll(ctx context.Context, check func() (bool, error)) error {
	wait := 10 * time.Microsecond
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		ok, err := check()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		wait = min(2*wait, time.Millisecond)
		timer.Reset(wait)
	}
}

func (c *Comm) abortWith(err error) error {
	if aerr := c.Abort(); aerr != nil {
		return fmt.Errorf("%w (and the abort failed: %v)", err, aerr)
	}
	return fmt.Errorf("%w; communicator aborted", err)
}
