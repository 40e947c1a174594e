package kernels

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/moex-project/moex/internal/buffers"
)

// FFNGroup is one expert applied to the rows routed to it: the unit of a
// grouped expert FFN.
type FFNGroup struct {
	Gate, Up Matrix    // [inter, hidden]
	Down     Matrix    // [hidden, inter]
	Rows     []int32   // [rows]: the rows of x this expert reads
	Scale    []float32 // [rows]: routing weight of each row, or nil for one
	Out      []float32 // [rows, hidden]: scale · expert(x[row])
	// Expert names the weights for implementations that keep them
	// elsewhere (a GPU): the routed expert's id, or SharedExpert.
	Expert int

	// GateBias, UpBias [inter] and DownBias [hidden] are the projections'
	// biases (gpt-oss), nil for none; Act is the activation (the zero
	// value: SwiGLU). Out = Scale · (Down·act(Gate·x + GateBias,
	// Up·x + UpBias) + DownBias).
	GateBias, UpBias, DownBias []float32
	Act                        Activation
	// ScaleInput: Scale weights the expert's input rather than its output
	// (llama4): Out = Down·act(Scale·(Gate·x) + GateBias, Scale·(Up·x) +
	// UpBias) + DownBias, the expert of Scale·x.
	ScaleInput bool
}

// Plain reports whether g is SwiGLU without biases, the expert every
// implementation runs (the device kernels run no other yet).
func (g *FFNGroup) Plain() bool {
	return g.Act.Kind == SiLU && g.GateBias == nil && g.UpBias == nil && g.DownBias == nil && !g.ScaleInput
}

// SharedExpert is FFNGroup.Expert of a shared expert.
const SharedExpert = -1

// GEMMGroup is one expert's share of a grouped GEMM:
// Out[r, n] = Scale[r] · (A[Rows[r]] · B[n]).
type GEMMGroup struct {
	B     Matrix    // [n, k]
	Rows  []int32   // [rows]: the rows of A this group reads
	Scale []float32 // [rows], or nil
	Out   []float32 // [rows, n]
}

// Work is split into items of at most tileCols output columns × tileRows
// rows, so that one hot expert still spreads over every worker.
const (
	tileCols = 64
	tileRows = 192
)

// decodeRows and decodeWiden: an expert with at most decodeRows rows (one
// kernel strip: its weights are read once either way) is split into items
// decodeWiden times wider, so that the per-item costs weigh less beside
// its few products. Measured (DeepSeek-V2-Lite, 2 threads): eight tiles
// took 15-25 % off a decode step's experts against one, and four rows
// rather than two 10 % off the int8-dot layer at 16 tokens.
var decodeRows, decodeWiden = 4, 8

// Scratch keeps a grouped FFN's intermediate activations and its working
// lists between calls, so that a step neither allocates nor faults in
// fresh memory; the zero value is ready. One per concurrent caller.
type Scratch struct {
	h      []float32
	xr, hr []magRange
	xq     dot8Rows   // x quantized for the int8-dot mode
	hq     []dot8Rows // each group's h likewise

	items []ffnItem      // the work list: gate/up items, each group's down items after the next group's
	hs    [][]float32    // each group's h
	hrs   [][]magRange   // each group's h rows' magnitude ranges, where needed
	hqs   []*dot8Rows    // each group's h quantized or rounded, where needed
	eps   []*glu         // each group's epilogue
	left  []atomic.Int32 // each group's gate/up items not yet done, plus one until its h is ready
	mu    sync.Mutex     // with cond: down items waiting for their group
	cond  *sync.Cond
}

// waitSpins is how often a down item looks for its group to be ready
// before it sleeps: the group's last gate/up items are usually a few
// microseconds from done.
const waitSpins = 64

// wait returns once group g's h is ready (true) or an item has failed
// (false).
func (s *Scratch) wait(left []atomic.Int32, g int, stop *atomic.Bool) bool {
	for range waitSpins {
		if left[g].Load() == 0 {
			return true
		}
		if stop.Load() {
			return false
		}
		runtime.Gosched()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for left[g].Load() != 0 && !stop.Load() {
		s.cond.Wait()
	}
	return left[g].Load() == 0
}

// wake wakes the waiting down items to look again.
func (s *Scratch) wake() {
	s.mu.Lock()
	s.cond.Broadcast()
	s.mu.Unlock()
}

// ffnItem is a grouped FFN's unit of work: rows [r0, r1) of group g,
// output columns [n0, n1) of its gate/up or (down) of its down projection.
type ffnItem struct {
	g, r0, r1, n0, n1 int
	down              bool
}

// GroupedFFN runs every group's SwiGLU FFN over x [tokens, hidden] on up to
// workers goroutines (0: GOMAXPROCS). The work is one list taken in order,
// each group's down items after the next group's gate/up items: a group's
// down items wait only for its own gate/up items (the last of which
// prepares its h for the down kernels), which by then are done or nearly,
// so that no step waits for every worker at a barrier. s (nil: none)
// keeps the buffers for the next call. It returns the context's error if
// it ends first.
func GroupedFFN(ctx context.Context, workers int, x []float32, groups []FFNGroup, s *Scratch) error {
	if s == nil {
		s = new(Scratch)
	}
	if s.cond == nil {
		s.cond = sync.NewCond(&s.mu)
	}
	ng := len(groups)
	total, need := 0, 0
	for _, g := range groups {
		total += len(g.Rows) * g.Gate.Rows
		if active != nil && active.pow2(g.Down) {
			need += len(g.Rows)
		}
	}
	all := buffers.Grow(&s.h, total)
	hrAll := buffers.Grow(&s.hr, need)
	s.hs, s.hrs, s.hqs, s.eps = buffers.Grow(&s.hs, ng), buffers.Grow(&s.hrs, ng), buffers.Grow(&s.hqs, ng), buffers.Grow(&s.eps, ng)
	if cap(s.hq) < ng {
		s.hq = make([]dot8Rows, ng)
	}
	s.hq = s.hq[:ng]
	if len(s.left) < ng {
		s.left = make([]atomic.Int32, ng)
	}
	left := s.left[:ng]
	items := s.items[:0]
	downs := func(i int) { // group i's down items
		g := &groups[i]
		hidden, rows := g.Down.Rows, len(g.Rows)
		cols := ffnCols(rows)
		for r := 0; r < rows; r += tileRows {
			for n := 0; n < hidden; n += cols {
				items = append(items, ffnItem{i, r, min(r+tileRows, rows), n, min(n+cols, hidden), true})
			}
		}
	}
	for i := range groups {
		g := &groups[i]
		inter, rows := g.Gate.Rows, len(g.Rows)
		s.hs[i], all = all[:rows*inter], all[rows*inter:]
		s.hrs[i], s.hqs[i] = nil, nil
		if active != nil && active.pow2(g.Down) {
			s.hrs[i], hrAll = hrAll[:rows:rows], hrAll[rows:]
		}
		s.eps[i] = newGLU(g)
		n0 := len(items)
		cols := ffnCols(rows)
		for r := 0; r < rows; r += tileRows {
			for n := 0; n < inter; n += cols {
				items = append(items, ffnItem{i, r, min(r+tileRows, rows), n, min(n+cols, inter), false})
			}
		}
		left[i].Store(int32(len(items)-n0) + 1)
		if i > 0 { // the previous group's down items after this group's gate/up ones
			downs(i - 1)
		}
	}
	if ng > 0 {
		downs(ng - 1)
	}
	s.items = items
	// The rows' magnitude ranges, for kernels that need them (see
	// pow2Exact), once per call rather than once per tile.
	s.xr = s.xr[:0]
	var xr []magRange
	for _, g := range groups {
		if active != nil && active.pow2(g.Gate, g.Up) {
			xr = rowRanges(s.xr, x, g.Gate.Cols, g.Gate, g.Up)
			s.xr = xr
			break
		}
	}
	// x quantized once for the int8-dot mode, rather than once per tile.
	var xq *dot8Rows
	for _, g := range groups {
		if g.Gate.dot8 {
			if err := s.xq.quantizeAll(ctx, workers, x, g.Gate.Cols, g.Gate.q.cols); err != nil {
				return err
			}
			xq = &s.xq
			break
		}
		if g.Gate.bdot { // likewise rounded once for the bf16-dot mode
			if err := s.xq.roundAll(ctx, workers, x, g.Gate.Cols); err != nil {
				return err
			}
			xq = &s.xq
			break
		}
	}
	// ready prepares group i's h for its down items (magnitude ranges,
	// quantized or rounded once rather than once per tile), then lets them
	// run.
	ready := func(i int) {
		g := &groups[i]
		inter := g.Gate.Rows
		for r := range s.hrs[i] {
			s.hrs[i][r] = magnitudeRange(s.hs[i][r*inter:][:inter])
		}
		switch d := g.Down; {
		case d.dot8:
			s.hq[i].quantizeAll(context.Background(), 1, s.hs[i], d.Cols, d.q.cols)
			s.hqs[i] = &s.hq[i]
		case d.bdot:
			s.hq[i].roundAll(context.Background(), 1, s.hs[i], d.Cols)
			s.hqs[i] = &s.hq[i]
		}
		left[i].Store(0)
		s.wake()
	}
	for i := range groups {
		if left[i].Load() == 1 { // no gate/up items
			ready(i)
		}
	}
	var stop atomic.Bool // an item failed: waiting items give up
	return Parallel(ctx, workers, len(items), func(k int) {
		finished := false
		defer func() {
			if !finished {
				stop.Store(true)
				s.wake()
			}
		}()
		it := items[k]
		g := &groups[it.g]
		inter, hidden := g.Gate.Rows, g.Down.Rows
		h := s.hs[it.g][it.r0*inter : it.r1*inter]
		if !it.down {
			gateUp(h, x, xr, xq, g.Rows[it.r0:it.r1], g.Gate, g.Up, s.eps[it.g].tile(g, it.r0, it.r1), it.n0, it.n1)
			if left[it.g].Add(-1) == 1 {
				ready(it.g)
			}
			finished = true
			return
		}
		// Items are taken in order: every gate/up item of the group is
		// running or done, so this waits at most for other workers' items,
		// each of which ends (the last readies the group) or fails (and
		// stops every wait).
		if !s.wait(left, it.g, &stop) {
			finished = true
			return
		}
		var scale []float32
		if g.Scale != nil && !g.ScaleInput {
			scale = g.Scale[it.r0:it.r1]
		}
		var rr []magRange
		if hr := s.hrs[it.g]; hr != nil {
			rr = hr[it.r0:it.r1]
		}
		var aq *dot8Rows
		if q := s.hqs[it.g]; q != nil {
			sub := q.from(it.r0)
			aq = &sub
		}
		gemmRows(g.Out[it.r0*hidden:it.r1*hidden], h, rr, aq, nil, g.Down, g.DownBias, scale, it.n0, it.n1)
		finished = true
	})
}

// ffnCols is the output columns of a grouped FFN's items for a group of
// rows rows.
func ffnCols(rows int) int {
	if rows <= decodeRows {
		return tileCols * decodeWiden
	}
	return tileCols
}

// GroupedGEMM computes every group's Out = Scale · A[Rows]·Bᵀ, A [tokens, k],
// on up to workers goroutines (0: GOMAXPROCS).
func GroupedGEMM(ctx context.Context, workers int, a []float32, groups []GEMMGroup) error {
	type item struct{ g, r0, r1, n0, n1 int }
	var items []item
	for i, g := range groups {
		cols := ffnCols(len(g.Rows)) // a few rows: wider items, fewer calls a step
		for r := 0; r < len(g.Rows); r += tileRows {
			for n := 0; n < g.B.Rows; n += cols {
				items = append(items, item{i, r, min(r+tileRows, len(g.Rows)), n, min(n+cols, g.B.Rows)})
			}
		}
	}
	var ar []magRange // a's rows' magnitude ranges, where needed
	for _, g := range groups {
		if active != nil && active.pow2(g.B) {
			ar = rowRanges(nil, a, g.B.Cols, g.B)
			break
		}
	}
	// a's rows quantized (int8-dot) or rounded (bf16-dot) once, where needed.
	var aq *dot8Rows
	for _, g := range groups {
		if g.B.dot8 || g.B.bdot {
			aq = new(dot8Rows)
			var err error
			if g.B.dot8 {
				err = aq.quantizeAll(ctx, workers, a, g.B.Cols, g.B.q.cols)
			} else {
				err = aq.roundAll(ctx, workers, a, g.B.Cols)
			}
			if err != nil {
				return err
			}
			break
		}
	}
	return Parallel(ctx, workers, len(items), func(k int) {
		it := items[k]
		g := &groups[it.g]
		N := g.B.Rows
		var scale []float32
		if g.Scale != nil {
			scale = g.Scale[it.r0:it.r1]
		}
		gemmRows(g.Out[it.r0*N:it.r1*N], a, ar, aq, g.Rows[it.r0:it.r1], g.B, nil, scale, it.n0, it.n1)
	})
}

// FaultError is a fault on memory a kernel read: memory unmapped under it,
// or a page of a mapped file that the file no longer has (truncated or
// replaced in place while mapped). Addr is the faulting address, which the
// owner of the mapping can name.
type FaultError struct{ Addr uintptr }

func (e *FaultError) Error() string {
	return fmt.Sprintf("kernels: a read of address %#x faulted: the memory is no longer mapped, or the file mapped there was cut short", e.Addr)
}

// guard calls fn(i) with the calling goroutine's faults (SetPanicOnFault
// set by the caller) turned into a *FaultError.
func guard(fn func(i int), i int) (err *FaultError) {
	defer func() {
		if r := recover(); r != nil {
			// A fault near address zero is a nil dereference: a bug, not
			// a mapping, so it stays a panic.
			f, ok := r.(interface{ Addr() uintptr })
			if !ok || f.Addr() < 4096 {
				panic(r)
			}
			err = &FaultError{Addr: f.Addr()}
		}
	}()
	fn(i)
	return nil
}
