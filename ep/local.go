package ep

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// NewLocal returns n connected in-process Comms, one per rank, each to be
// used by one goroutine. Collectives read the other ranks' buffers in place
// (one copy from sender to receiver, no staging) and return once every rank
// has read them.
func NewLocal(n int) ([]Comm, error) {
	if n < 1 {
		return nil, fmt.Errorf("ep: NewLocal(%d): need at least one rank", n)
	}
	h := &hub{n: n, rounds: map[uint64]*round{}, aborted: make(chan struct{})}
	cs := make([]Comm, n)
	for r := range cs {
		cs[r] = &local{h: h, rank: r}
	}
	return cs, nil
}

type hub struct {
	n        int
	mu       sync.Mutex
	rounds   map[uint64]*round
	abortErr error
	aborted  chan struct{}
}

// round is one collective call, identified by its sequence number.
type round struct {
	contrib  []contribution
	arrived  int
	departed int
	allIn    chan struct{}
	allOut   chan struct{}
}

type contribution struct {
	kind   string
	bytes  []byte    // AllGather
	sendTo [][]byte  // AllToAllV
	i64    []int64   // AllReduceInt64
	f32    []float32 // AllReduceFloat32, ReduceScatter
	op     Op
	counts []int // ReduceScatter
	joined bool
}

type local struct {
	h     *hub
	rank  int
	seq   uint64
	arena []byte // receive buffers, reused by every call
}

// take carves buffers of the given sizes, each starting at an 8-byte
// boundary, out of the rank's arena; they stay valid until the next call.
func (c *local) take(sizes []int) [][]byte {
	total := 0
	for _, n := range sizes {
		total += (n + 7) &^ 7
	}
	if cap(c.arena) < total {
		c.arena = make([]byte, total+total/4)
	}
	out := make([][]byte, len(sizes))
	off := 0
	for i, n := range sizes {
		out[i] = c.arena[off : off+n : off+n]
		off += (n + 7) &^ 7
	}
	return out
}

func (c *local) Rank() int { return c.rank }
func (c *local) Size() int { return c.h.n }

// Abort breaks the group for every rank.
func (c *local) Abort(err error) { c.h.abort(err) }

func (h *hub) abort(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.abortErr == nil {
		h.abortErr = fmt.Errorf("%w: %w", ErrAborted, err)
		close(h.aborted)
	}
}

// run performs one collective: deposit, wait for all, check that the calls
// match, read (compute this rank's result), wait until every rank has read.
func (c *local) run(ctx context.Context, my contribution, read func(all []contribution) error) error {
	h := c.h
	c.seq++
	seq := c.seq
	my.joined = true
	h.mu.Lock()
	if h.abortErr != nil {
		err := h.abortErr
		h.mu.Unlock()
		return err
	}
	rd := h.rounds[seq]
	if rd == nil {
		rd = &round{contrib: make([]contribution, h.n), allIn: make(chan struct{}), allOut: make(chan struct{})}
		h.rounds[seq] = rd
	}
	rd.contrib[c.rank] = my
	rd.arrived++
	if rd.arrived == h.n {
		close(rd.allIn)
	}
	h.mu.Unlock()

	if err := c.wait(ctx, rd.allIn, my.kind, seq, rd, false); err != nil {
		return err
	}
	err := checkMatch(rd.contrib, seq)
	if err == nil {
		err = read(rd.contrib)
	}
	if err != nil {
		h.abort(err)
	}
	h.mu.Lock()
	rd.departed++
	if rd.departed == h.n {
		close(rd.allOut)
		delete(h.rounds, seq)
	}
	h.mu.Unlock()
	if werr := c.wait(ctx, rd.allOut, my.kind, seq, rd, true); err == nil {
		err = werr
	}
	return err
}

// wait blocks until ch closes, the group aborts or ctx ends; in the last
// case it aborts the group, naming the ranks still missing.
func (c *local) wait(ctx context.Context, ch chan struct{}, kind string, seq uint64, rd *round, leaving bool) error {
	select {
	case <-ch:
		return nil
	case <-c.h.aborted:
		c.h.mu.Lock()
		defer c.h.mu.Unlock()
		return fmt.Errorf("ep: %s #%d on rank %d: %w", kind, seq, c.rank, c.h.abortErr)
	case <-ctx.Done():
	}
	c.h.mu.Lock()
	var missing []int
	for r, ct := range rd.contrib {
		if !ct.joined {
			missing = append(missing, r)
		}
	}
	c.h.mu.Unlock()
	what := fmt.Sprintf("ranks %v did not arrive", missing)
	if leaving || len(missing) == 0 {
		what = "the other ranks did not finish"
	}
	err := fmt.Errorf("ep: %s #%d on rank %d: %s: %w", kind, seq, c.rank, what, ctx.Err())
	c.h.abort(err)
	return err
}

func checkMatch(all []contribution, seq uint64) error {
	for r, ct := range all {
		if ct.kind != all[0].kind {
			return fmt.Errorf("ep: collective #%d: rank 0 called %s, rank %d called %s", seq, all[0].kind, r, ct.kind)
		}
	}
	return nil
}

func (c *local) AllGather(ctx context.Context, send []byte) ([][]byte, error) {
	var out [][]byte
	err := c.run(ctx, contribution{kind: "AllGather", bytes: send}, func(all []contribution) error {
		sizes := make([]int, len(all))
		for r, ct := range all {
			sizes[r] = len(ct.bytes)
		}
		out = c.take(sizes)
		for r, ct := range all {
			copy(out[r], ct.bytes)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *local) AllToAllV(ctx context.Context, send [][]byte) ([][]byte, error) {
	if len(send) != c.h.n {
		err := fmt.Errorf("ep: AllToAllV on rank %d: %d send buffers for %d ranks", c.rank, len(send), c.h.n)
		c.h.abort(err)
		return nil, err
	}
	var out [][]byte
	err := c.run(ctx, contribution{kind: "AllToAllV", sendTo: send}, func(all []contribution) error {
		sizes := make([]int, len(all))
		for r, ct := range all {
			sizes[r] = len(ct.sendTo[c.rank])
		}
		out = c.take(sizes)
		for r, ct := range all {
			copy(out[r], ct.sendTo[c.rank])
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *local) AllReduceInt64(ctx context.Context, v []int64, op Op) error {
	return allReduce(ctx, c, "AllReduceInt64", v, op, contribution{i64: v}, func(ct contribution) []int64 { return ct.i64 })
}

func (c *local) AllReduceFloat32(ctx context.Context, v []float32, op Op) error {
	return allReduce(ctx, c, "AllReduceFloat32", v, op, contribution{f32: v}, func(ct contribution) []float32 { return ct.f32 })
}

// allReduce reduces every rank's values element-wise in rank order, so the
// result is the same on every rank and from run to run.
func allReduce[T int64 | float32](ctx context.Context, c *local, kind string, v []T, op Op, my contribution, vals func(contribution) []T) error {
	res := make([]T, len(v))
	my.kind, my.op = kind, op
	err := c.run(ctx, my, func(all []contribution) error {
		if err := sameLengths(all, func(ct contribution) int { return len(vals(ct)) }, kind); err != nil {
			return err
		}
		if err := sameOp(all); err != nil {
			return err
		}
		copy(res, vals(all[0]))
		for _, ct := range all[1:] {
			for i, x := range vals(ct) {
				res[i] = reduce(op, res[i], x)
			}
		}
		return nil
	})
	if err == nil {
		copy(v, res)
	}
	return err
}

func (c *local) ReduceScatter(ctx context.Context, v []float32, counts []int) ([]float32, error) {
	var out []float32
	err := c.run(ctx, contribution{kind: "ReduceScatter", f32: v, counts: counts}, func(all []contribution) error {
		if err := sameLengths(all, func(ct contribution) int { return len(ct.f32) }, "ReduceScatter"); err != nil {
			return err
		}
		for r, ct := range all {
			if !slices.Equal(ct.counts, all[0].counts) {
				return fmt.Errorf("ep: ReduceScatter: rank %d passed counts %v, rank 0 passed %v", r, ct.counts, all[0].counts)
			}
		}
		if err := checkCounts(counts, len(v), c.h.n); err != nil {
			return err
		}
		lo := 0
		for _, n := range counts[:c.rank] {
			lo += n
		}
		out = make([]float32, counts[c.rank])
		for _, ct := range all {
			for i := range out {
				out[i] += ct.f32[lo+i]
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *local) Barrier(ctx context.Context) error {
	return c.run(ctx, contribution{kind: "Barrier"}, func([]contribution) error { return nil })
}

func checkCounts(counts []int, n, ranks int) error {
	if len(counts) != ranks {
		return fmt.Errorf("ep: ReduceScatter: %d counts for %d ranks", len(counts), ranks)
	}
	total := 0
	for _, c := range counts {
		if c < 0 {
			return fmt.Errorf("ep: ReduceScatter: negative count in %v", counts)
		}
		total += c
	}
	if total != n {
		return fmt.Errorf("ep: ReduceScatter: counts %v add up to %d, the buffer holds %d", counts, total, n)
	}
	return nil
}

func sameLengths(all []contribution, n func(contribution) int, kind string) error {
	for r, ct := range all {
		if n(ct) != n(all[0]) {
			return fmt.Errorf("ep: %s: rank %d passed %d values, rank 0 passed %d", kind, r, n(ct), n(all[0]))
		}
	}
	return nil
}

func sameOp(all []contribution) error {
	for r, ct := range all {
		if ct.op != all[0].op {
			return fmt.Errorf("ep: all-reduce: rank %d asked for %v, rank 0 for %v", r, ct.op, all[0].op)
		}
	}
	if op := all[0].op; op != Sum && op != Min && op != Max {
		return fmt.Errorf("ep: all-reduce: unknown reduction %v", op)
	}
	return nil
}

func reduce[T int64 | float32](op Op, a, b T) T {
	switch op {
	case Min:
		return min(a, b)
	case Max:
		return max(a, b)
	}
	return a + b
}

// RunLocal runs f on n connected in-process ranks at once, one goroutine
// each, and returns every rank's error. A rank whose f fails aborts the
// group, so that the others do not wait for it until their deadline.
func RunLocal(n int, f func(c Comm) error) ([]error, error) {
	comms, err := NewLocal(n)
	if err != nil {
		return nil, err
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			if errs[r] = f(c); errs[r] != nil {
				c.Abort(fmt.Errorf("rank %d: %w", r, errs[r]))
			}
		})
	}
	wg.Wait()
	return errs, nil
}
