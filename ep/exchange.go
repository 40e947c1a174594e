package ep

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
)

// Dispatched is what one rank received in a dispatch: the rows routed to
// its experts, and what it needs to send their outputs back.
type Dispatched struct {
	Rows   []Row     // every received row, by source rank then send order
	Hidden []float32 // [len(Rows), hidden]: their hidden states

	hidden  int
	topK    int
	tokens  int
	pairsTo [][]int32 // per destination, the (token·K + slot) pairs sent there, in order
	from    []int     // rows received from each source
	ex      *Exchanger
}

// Row is one (token, expert) pair received for computation.
type Row struct {
	Src    int     // source rank
	Token  int     // token index on the source rank
	Slot   int     // position among the token's experts
	Expert int     // expert id
	Weight float32 // routing weight
}

// dispatch metadata per row: expert, source token, slot, routing weight.
const metaInts = 4

// Exchanger holds one rank's dispatch and combine buffers, reused from
// step to step (a step moves megabytes; fresh buffers would cost page
// faults every time). One per rank; not for concurrent use.
type Exchanger struct {
	send    [][]byte
	hidden  []float32
	pairOut []float32
}

// grow returns b resized to n, reallocating only when it is too small.
func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n, n+n/4)
	}
	return b[:n]
}

// Dispatch sends every (token, expert) pair of this rank's routing (ids,
// weights [tokens, k]) with the token's hidden state (x [tokens, hidden]) to
// the rank place picks for it (by global token index: offset + token), in
// one all-to-all.
//
// Hidden has room for extra more rows after the received ones, left for
// the caller (the EP layer puts its own tokens there for the shared expert).
// The returned Hidden, like Return's result, lives in the Exchanger's
// buffers: valid until its next Dispatch.
func (ex *Exchanger) Dispatch(ctx context.Context, comm Comm, place *Placement, x []float32, ids []int32, weights []float32, hidden, k, offset, extra int) (*Dispatched, error) {
	R := comm.Size()
	d := &Dispatched{hidden: hidden, topK: k, tokens: len(ids) / k, pairsTo: make([][]int32, R), from: make([]int, R), ex: ex}
	for p, e := range ids {
		if e < 0 || int(e) >= place.NumExperts {
			err := fmt.Errorf("ep: dispatch: token %d routed to expert %d, out of range [0, %d)", p/k, e, place.NumExperts)
			comm.Abort(err)
			return nil, err
		}
		dst := place.Dest(int(e), offset+p/k)
		d.pairsTo[dst] = append(d.pairsTo[dst], int32(p))
	}
	rowBytes := 4 * (metaInts + hidden)
	ex.send = grow(ex.send, R)
	send := ex.send
	for dst, pairs := range d.pairsTo {
		buf := grow(send[dst], rowBytes*len(pairs))
		meta := buf[:4*metaInts*len(pairs)]
		rows := castF32(buf[len(meta):])
		for i, p := range pairs {
			t := int(p) / k
			binary.LittleEndian.PutUint32(meta[16*i:], uint32(ids[p]))
			binary.LittleEndian.PutUint32(meta[16*i+4:], uint32(t))
			binary.LittleEndian.PutUint32(meta[16*i+8:], uint32(int(p)%k))
			binary.LittleEndian.PutUint32(meta[16*i+12:], math.Float32bits(weights[p]))
			copy(rows[i*hidden:(i+1)*hidden], x[t*hidden:(t+1)*hidden])
		}
		send[dst] = buf
	}
	recv, err := comm.AllToAllV(ctx, send)
	if err != nil {
		return nil, err
	}
	total := 0
	for s, buf := range recv {
		if len(buf)%rowBytes != 0 {
			err := fmt.Errorf("ep: dispatch: rank %d sent %d bytes, not whole rows of %d values", s, len(buf), metaInts+hidden)
			comm.Abort(err)
			return nil, err
		}
		d.from[s] = len(buf) / rowBytes
		total += d.from[s]
	}
	d.Rows = make([]Row, 0, total)
	ex.hidden = grow(ex.hidden, (total+extra)*hidden)
	d.Hidden = ex.hidden
	for s, buf := range recv {
		n := d.from[s]
		rows := castF32(buf[16*n:])
		for i := 0; i < n; i++ {
			e := int(int32(binary.LittleEndian.Uint32(buf[16*i:])))
			if e < 0 || e >= place.NumExperts {
				err := fmt.Errorf("ep: dispatch: rank %d sent a row for expert %d, out of range", s, e)
				comm.Abort(err)
				return nil, err
			}
			copy(d.Hidden[len(d.Rows)*hidden:], rows[i*hidden:(i+1)*hidden])
			d.Rows = append(d.Rows, Row{Src: s, Token: int(binary.LittleEndian.Uint32(buf[16*i+4:])),
				Slot: int(binary.LittleEndian.Uint32(buf[16*i+8:])), Expert: e,
				Weight: math.Float32frombits(binary.LittleEndian.Uint32(buf[16*i+12:]))})
		}
	}
	return d, nil
}

// Return sends out [len(Rows), hidden], the output of every received row,
// back to the rows' sources in one all-to-all, and returns this rank's
// outputs per (token, slot): [tokens·k, hidden], in the Exchanger's buffer.
func (d *Dispatched) Return(ctx context.Context, comm Comm, out []float32) ([]float32, error) {
	H := d.hidden
	if len(out) != len(d.Rows)*H {
		err := fmt.Errorf("ep: combine: %d output values for %d rows", len(out), len(d.Rows))
		comm.Abort(err)
		return nil, err
	}
	back := make([][]byte, comm.Size())
	lo := 0
	for s, n := range d.from {
		back[s] = Bytes(out[lo*H : (lo+n)*H])
		lo += n
	}
	results, err := comm.AllToAllV(ctx, back)
	if err != nil {
		return nil, err
	}
	d.ex.pairOut = grow(d.ex.pairOut, d.tokens*d.topK*H)
	pairOut := d.ex.pairOut
	for dst, pairs := range d.pairsTo {
		res := castF32(results[dst])
		if len(res) != len(pairs)*H {
			err := fmt.Errorf("ep: combine: rank %d returned %d values for %d rows", dst, len(res), len(pairs))
			comm.Abort(err)
			return nil, err
		}
		for i, p := range pairs {
			copy(pairOut[int(p)*H:(int(p)+1)*H], res[i*H:(i+1)*H])
		}
	}
	return pairOut, nil
}

// castF32 views 4-byte-aligned bytes as float32s.
func castF32(b []byte) []float32 {
	v, err := FromBytesView(b)
	if err != nil {
		panic(err) // every buffer here is a fresh allocation, aligned
	}
	return v
}

// RoundTrip runs a dispatch and a combine on every in-process rank at once,
// the experts being the identity (each row returns unchanged): the traffic
// of an EP step without its compute, for benchmarks. xs[r], ids[r] and
// weights[r] are rank r's tokens and routing.
func RoundTrip(ctx context.Context, comms []Comm, exs []*Exchanger, place *Placement, xs [][]float32, ids [][]int32, weights [][]float32, hidden, k int) error {
	errs := make([]error, len(comms))
	done := make(chan struct{})
	offset := 0
	for r, c := range comms {
		go func(off int) {
			defer func() { done <- struct{}{} }()
			d, err := exs[r].Dispatch(ctx, c, place, xs[r], ids[r], weights[r], hidden, k, off, 0)
			if err == nil {
				_, err = d.Return(ctx, c, d.Hidden)
			}
			errs[r] = err
		}(offset)
		offset += len(xs[r]) / hidden
	}
	for range comms {
		<-done
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// RoundTripBytes is the bytes a RoundTrip moves between ranks: every
// (token, expert) pair's hidden state and metadata out, its output back.
func RoundTripBytes(tokens, hidden, k int) int64 {
	return int64(tokens) * int64(k) * (4*int64(metaInts+hidden) + 4*int64(hidden))
}
