//go:build cuda || cudaemu

package cuda

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/kernels"
)

// Attention computes MLA decode on a device for latent caches
// (dpattn.AttentionCore): each cache gets a copy there, kept in sync block by
// block from what the cache reports changed (a decode step writes one row
// per sequence: one block each), and the MLA decode kernels (split-KV, then
// the log-sum-exp merge) run over it. Safe for concurrent use: ranks with
// caches of their own may share it.
type Attention struct {
	d Launcher
	// SplitRows is the split-KV chunk length; 0: 512.
	SplitRows int

	mu      sync.Mutex
	mirrors map[*dpattn.LatentCache]*mirror
}

type mirror struct {
	mu   sync.Mutex
	buf  Buffer
	seen []uint64
}

var _ dpattn.AttentionCore = (*Attention)(nil)

// NewAttention makes the attention core of a device.
func NewAttention(d Launcher) *Attention {
	return &Attention{d: d, mirrors: map[*dpattn.LatentCache]*mirror{}}
}

// Close frees the device copies of the caches.
func (a *Attention) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for c, m := range a.mirrors {
		a.d.Free(m.buf)
		delete(a.mirrors, c)
	}
}

func (a *Attention) mirrorOf(c *dpattn.LatentCache) (*mirror, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if m := a.mirrors[c]; m != nil {
		return m, nil
	}
	b, err := a.d.Alloc(c.BytesTotal())
	if err != nil {
		return nil, fmt.Errorf("cuda: attention: a device copy of the %d-byte cache: %w", c.BytesTotal(), err)
	}
	m := &mirror{buf: b, seen: make([]uint64, c.NumBlocks())}
	a.mirrors[c] = m
	return m, nil
}

// Attend computes out [queries, heads, dv] of MLA over c's device copy
// after bringing it up to date.
func (a *Attention) Attend(ctx context.Context, c *dpattn.LatentCache, q []float32, queries []dpattn.Query, heads, dv int,
	scale float32, out []float32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m, err := a.mirrorOf(c)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := c.Changed(m.seen, func(block int, data []byte) error {
		return a.d.ToDeviceAt(m.buf, int64(block)*int64(len(data)), unsafe.Pointer(&data[0]), int64(len(data)))
	}); err != nil {
		return err
	}
	B := len(queries)
	maxBlocks := 1
	for _, qr := range queries {
		maxBlocks = max(maxBlocks, len(qr.Table))
	}
	in := MLAInput{Q: q, BlockSize: c.BlockSize(), D: c.Dim(), BlockTable: make([]int32, B*maxBlocks), MaxBlocks: maxBlocks,
		SeqLens: make([]int32, B), Heads: heads, DV: dv, SplitRows: a.SplitRows, Scale: scale}
	if in.SplitRows == 0 {
		in.SplitRows = 512
	}
	for i, qr := range queries {
		copy(in.BlockTable[i*maxBlocks:], qr.Table)
		in.SeqLens[i] = int32(qr.Len)
	}
	if err := in.check(c.NumBlocks()); err != nil {
		return err
	}
	if len(out) != B*heads*dv {
		return fmt.Errorf("cuda: attention: out has %d values, want %d × %d × %d", len(out), B, heads, dv)
	}
	o, _, err := mlaDecode(a.d, m.buf, c.DType() == kernels.BF16, in)
	if err != nil {
		return err
	}
	copy(out, o)
	return nil
}
