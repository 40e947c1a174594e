package kernels

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// Parallel calls fn(0), …, fn(n-1) on up to workers goroutines (0:
// GOMAXPROCS), handing out indices in order, and returns the context's
// error if it ends first (calls in progress finish). A fault on memory fn
// reads (a mapped file truncated under it) stops the calls and returns a
// *FaultError instead of crashing the process; any other panic in fn is
// passed on.
//
// The caller runs a share itself. The other shares go to helper
// goroutines kept between calls (see parPool) when no other call holds
// them, else to goroutines started for this call.
func Parallel(ctx context.Context, workers, n int, fn func(i int)) error {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if workers == 1 || n <= 1 {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		for i := 0; i < n; i++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := guard(fn, i); err != nil {
				return err
			}
		}
		return ctx.Err()
	}
	j := &parJob{ctx: ctx, fn: fn, n: n, done: make(chan struct{})}
	helpers := min(workers, n) - 1
	pooled := 0
	if pool.busy.CompareAndSwap(false, true) {
		pooled = min(helpers, runtime.GOMAXPROCS(0)-1)
		if pooled == 0 {
			pool.busy.Store(false)
		}
	}
	for w := pooled; w < helpers; w++ {
		go func() {
			debug.SetPanicOnFault(true)
			j.share()
		}()
	}
	if pooled > 0 {
		pool.dispatch(j, pooled)
	}
	// The caller's share starts now, not when a goroutine is scheduled. A
	// panic there (a bug) stops the others and waits for them before it
	// goes on.
	func() {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		done := false
		defer func() {
			if !done { // a panic, or fn ended the goroutine (runtime.Goexit)
				j.quit.Store(true)
				j.finish(pooled > 0)
				if r := recover(); r != nil {
					panic(r)
				}
			}
		}()
		j.work()
		done = true
	}()
	j.finish(pooled > 0)
	if f := j.fault.Load(); f != nil {
		return f
	}
	return ctx.Err()
}

// parJob is one call of Parallel.
type parJob struct {
	ctx   context.Context
	fn    func(int)
	n     int
	next  atomic.Int64
	fault atomic.Pointer[FaultError]
	quit  atomic.Bool // the caller's own share panicked
	// helpers is the pool's helpers that may join and seq the job's
	// number in the pool (both set before the job is published).
	helpers int
	seq     uint64
	// joined counts the helpers inside work; parClosed, set once the
	// caller's share ends, turns later ones away.
	joined atomic.Int64
	done   chan struct{} // closed by the last helper out after parClosed
}

const parClosed = 1 << 62

// work calls fn on indices not yet handed out until none is left, the
// context ends or a call faults.
func (j *parJob) work() {
	for j.ctx.Err() == nil && j.fault.Load() == nil && !j.quit.Load() {
		i := int(j.next.Add(1) - 1)
		if i >= j.n {
			return
		}
		if err := guard(j.fn, i); err != nil {
			j.fault.CompareAndSwap(nil, err)
			return
		}
	}
}

// share is a helper's part of the job: none if the caller's share has
// already ended it.
func (j *parJob) share() {
	for {
		s := j.joined.Load()
		if s&parClosed != 0 {
			return
		}
		if j.joined.CompareAndSwap(s, s+1) {
			break
		}
	}
	defer func() {
		if j.joined.Add(-1) == parClosed {
			close(j.done)
		}
	}()
	j.work()
}

// finish turns away helpers that have not joined, waits for those inside
// to leave (spinning a while first: a parked goroutine takes long to
// wake), and hands the pool back if the job held it.
func (j *parJob) finish(pooled bool) {
	if j.joined.Or(parClosed)&^parClosed != 0 {
		start := time.Now()
		for i := 1; j.joined.Load() != parClosed; i++ {
			if pollStep(i, start) {
				<-j.done
				break
			}
		}
	}
	if pooled {
		pool.job.Store(nil) // the helpers keep no job (and what fn holds) alive
		pool.busy.Store(false)
	}
}

// parSpin is how long an idle helper (or a caller waiting for helpers)
// polls before it parks: waking a parked goroutine took 140 µs on average
// on a 2-core VM (33 calls a decode step of Qwen3-30B-A3B, 4.7 ms a step
// lost), polling a few ns. parIdle is how long a parked helper waits for
// work before it ends.
const (
	parSpin = time.Millisecond
	parIdle = 100 * time.Millisecond
)

// parPool is Parallel's helpers, kept between calls: one call at a time
// holds them (busy); the calls made while it does (nested ones, or other
// goroutines') start their own. A helper polls for the next job for
// parSpin, parks, and ends after parIdle parked.
type parPool struct {
	busy    atomic.Bool
	job     atomic.Pointer[parJob]
	helpers []*parHelper // written by the holder of busy alone
	seq     uint64       // the last job's number: likewise
}

var pool parPool

// A helper's states.
const (
	helperAwake int32 = iota
	helperParked
	helperEnded
)

type parHelper struct {
	state atomic.Int32
	wake  chan struct{} // a send moves a parked helper to awake
}

// dispatch publishes j to the first k helpers, starting those that ended
// and waking those parked.
func (p *parPool) dispatch(j *parJob, k int) {
	p.seq++
	j.helpers, j.seq = k, p.seq
	p.job.Store(j)
	for i := range k {
		if i == len(p.helpers) {
			p.helpers = append(p.helpers, nil)
		}
		h := p.helpers[i]
		for h != nil {
			s := h.state.Load()
			if s == helperAwake {
				break
			}
			if s == helperParked && h.state.CompareAndSwap(helperParked, helperAwake) {
				h.wake <- struct{}{}
				break
			}
			if s == helperEnded {
				h = nil
			}
		}
		if h == nil {
			h = &parHelper{wake: make(chan struct{}, 1)}
			p.helpers[i] = h
			go h.run(p, i)
		}
	}
}

// run is helper i's loop: each new job of the pool, joined if the job
// wants i.
func (h *parHelper) run(p *parPool, i int) {
	debug.SetPanicOnFault(true)
	var last uint64 // the number of the last job seen
	timer := time.NewTimer(parIdle)
	timer.Stop()
	for {
		j := p.await(last)
		if j == nil { // park
			h.state.Store(helperParked)
			if j = p.job.Load(); j == nil || j.seq == last {
				timer.Reset(parIdle)
				select {
				case <-h.wake:
					timer.Stop()
				case <-timer.C:
					if h.state.CompareAndSwap(helperParked, helperEnded) {
						return
					}
					<-h.wake
				}
				continue
			}
			if !h.state.CompareAndSwap(helperParked, helperAwake) {
				<-h.wake // the dispatcher's send
			}
		}
		last = j.seq
		if i < j.helpers {
			j.share()
		}
	}
}

// await polls for a job after job number last for parSpin; nil if none
// came.
func (p *parPool) await(last uint64) *parJob {
	start := time.Now()
	for i := 1; ; i++ {
		if j := p.job.Load(); j != nil && j.seq != last {
			return j
		}
		if pollStep(i, start) {
			return nil
		}
	}
}

// pollStep is step i of a polling loop that started at start: true once
// parSpin has passed (the clock read every 256 steps); every 4096 steps
// (some µs) it lets other goroutines have the thread. Yielding more often
// took the scheduler's lock in a tight loop beside the caller's work.
func pollStep(i int, start time.Time) bool {
	if i%256 != 0 {
		return false
	}
	if time.Since(start) > parSpin {
		return true
	}
	if i%4096 == 0 {
		runtime.Gosched()
	}
	return false
}
