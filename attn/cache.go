package attn

import (
	"context"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/memlimit"
	"github.com/moex-project/moex/kernels"
)

// DefaultBlockSize is the rows per cache block, as FlashMLA uses.
const DefaultBlockSize = 64

// Blocks gives the attention kernels the rows of a paged cache: block
// i as a [blockSize, dim] matrix.
type Blocks interface {
	BlockSize() int
	Dim() int
	NumBlocks() int
	Block(i int) kernels.Matrix
}

// Cache is MLA's paged latent-KV cache: one latent row (kv_lora_rank +
// rope dims, 576 for DeepSeek) per token, in blocks of BlockSize rows, each
// sequence with its own block table. fp32 or bf16 storage. Safe for
// concurrent use.
//
// Blocks are reference-counted: a sequence holds one reference on each
// block of its table, and Share hands out more (to a prefix cache), which
// Attach gives to a new sequence whose first rows they are; a block is
// free again when its last reference goes. Only whole blocks are shared,
// and a sequence writes only past the blocks it was attached to, so a
// shared block is never written.
type Cache struct {
	blockSize, dim, numBlocks int
	dtype                     kernels.DType
	f32                       []float32
	u16                       []uint16

	mu       sync.Mutex
	free     []int32 // free blocks, popped from the end
	refs     []int32 // per block: the sequences and Share holders that hold it
	shares   []int32 // per block: the Share holders among refs
	seqs     map[int]*sequence
	versions []uint64 // per block, bumped by every write: what a device copy syncs by
}

// Backend is where an attention block's work runs: Core computes MLA over
// a cache (over a device copy of it: dpattngpu.Attention), Proj the
// block's projections (dpattngpu.Attention's Projections). A nil field runs
// that part on the host; the zero Backend is the host.
type Backend struct {
	Core Core
	Proj Projector
}

// A Projector computes an attention block's projections, where it keeps
// the weights (a GPU holds them resident, keyed by the matrices' addresses,
// which stay put for the block's life).
type Projector interface {
	// Project computes out [rows, n] = x [rows, k] · wᵀ for w [n, k].
	Project(ctx context.Context, w *kernels.Matrix, x, out []float32) error
	// ProjectHeads computes out [rows, n] for rows of len(ws) heads each
	// (row r is head r % len(ws)): out[r] = x[r] · ws[r % len(ws)]ᵀ, every
	// ws[h] [n, k].
	ProjectHeads(ctx context.Context, ws []kernels.Matrix, x, out []float32) error
}

// cpuProjector is the Projector of the CPU kernels, each projection's
// column tiles (and heads) spread over GOMAXPROCS goroutines.
type cpuProjector struct{}

// projectAll computes outs[i] = x · ws[i]ᵀ for every i, every ws[i] of the
// same k: on the host as one grouped GEMM (one spread of the work over
// the goroutines, the activations quantized once for the int8-dot mode);
// elsewhere a Project each.
func projectAll(ctx context.Context, proj Projector, ws []*kernels.Matrix, x []float32, outs [][]float32) error {
	if _, host := proj.(cpuProjector); !host || len(ws) == 0 || ws[0].Cols == 0 {
		for i, w := range ws {
			if err := proj.Project(ctx, w, x, outs[i]); err != nil {
				return err
			}
		}
		return nil
	}
	rows := make([]int32, len(x)/ws[0].Cols)
	for r := range rows {
		rows[r] = int32(r)
	}
	groups := make([]kernels.GEMMGroup, len(ws))
	for i, w := range ws {
		groups[i] = kernels.GEMMGroup{B: *w, Rows: rows, Out: outs[i]}
	}
	return kernels.GroupedGEMM(ctx, 0, x, groups)
}

func (cpuProjector) Project(ctx context.Context, w *kernels.Matrix, x, out []float32) error {
	if w.Cols == 0 {
		clear(out)
		return nil
	}
	rows := make([]int32, len(x)/w.Cols)
	for r := range rows {
		rows[r] = int32(r)
	}
	return kernels.GroupedGEMM(ctx, 0, x, []kernels.GEMMGroup{{B: *w, Rows: rows, Out: out}})
}

func (cpuProjector) ProjectHeads(ctx context.Context, ws []kernels.Matrix, x, out []float32) error {
	heads := len(ws)
	if heads == 0 || len(x) == 0 || ws[0].Cols == 0 {
		clear(out)
		return nil
	}
	k, n := ws[0].Cols, ws[0].Rows
	T := len(x) / k / heads
	groups := make([]kernels.GEMMGroup, heads)
	tmp := make([]float32, heads*T*n)
	for h, w := range ws {
		rows := make([]int32, T)
		for t := range rows {
			rows[t] = int32(t*heads + h)
		}
		groups[h] = kernels.GEMMGroup{B: w, Rows: rows, Out: tmp[h*T*n : (h+1)*T*n]}
	}
	if err := kernels.GroupedGEMM(ctx, 0, x, groups); err != nil {
		return err
	}
	for h := range groups {
		for t := 0; t < T; t++ {
			copy(out[(t*heads+h)*n:(t*heads+h+1)*n], tmp[(h*T+t)*n:(h*T+t+1)*n])
		}
	}
	return nil
}

// An Core computes MLA (the contract of MLA, without lse) over a
// Cache, elsewhere than on its host memory: a GPU holding a copy of
// it, kept in sync through Changed.
type Core interface {
	Attend(ctx context.Context, c *Cache, q []float32, queries []Query, p MLAParams, out []float32) error
	// AttendGQA is GQA (the contract of GQA) there.
	AttendGQA(ctx context.Context, c *Cache, q []float32, queries []Query, p GQAParams, out []float32) error
}

// DType is the cache's storage type, F32, BF16 or F16.
func (c *Cache) DType() kernels.DType { return c.dtype }

// Changed calls fn with the contents of every block written since seen was
// last brought up to date (seen: one version per block, zero at first) and
// brings it up to date: how a device copy of the cache syncs. The cache is
// locked meanwhile.
func (c *Cache) Changed(seen []uint64, fn func(block int, data []byte) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(seen) != c.numBlocks {
		return fmt.Errorf("attn: %d block versions for a cache of %d blocks", len(seen), c.numBlocks)
	}
	n := c.blockSize * c.dim
	for i, v := range c.versions {
		if v == seen[i] {
			continue
		}
		var data []byte
		if c.dtype == kernels.F32 {
			data = unsafe.Slice((*byte)(unsafe.Pointer(&c.f32[i*n])), 4*n)
		} else {
			data = unsafe.Slice((*byte)(unsafe.Pointer(&c.u16[i*n])), 2*n)
		}
		if err := fn(i, data); err != nil {
			return err
		}
		seen[i] = v
	}
	return nil
}

type sequence struct {
	blocks []int32
	len    int
}

// NewCache makes a cache of numBlocks blocks of blockSize rows of dim
// values, stored as F32, BF16 or F16 (llama.cpp's default: three more
// bits of mantissa than bf16 in the same bytes, a range up to 65504).
func NewCache(numBlocks, blockSize, dim int, dtype kernels.DType) (*Cache, error) {
	if numBlocks < 1 || blockSize < 1 || dim < 1 {
		return nil, fmt.Errorf("attn: cache of %d blocks × %d rows × %d values", numBlocks, blockSize, dim)
	}
	if dtype != kernels.F32 && dtype != kernels.BF16 && dtype != kernels.F16 {
		return nil, fmt.Errorf("attn: cache dtype %v (want F32, BF16 or F16)", dtype)
	}
	if err := memlimit.Check(fmt.Sprintf("attn: a cache of %d blocks × %d rows × %d values", numBlocks, blockSize, dim),
		float64(numBlocks)*(float64(blockSize)*float64(dim)*float64(dtype.Size())+12)); err != nil {
		return nil, err
	}
	c := &Cache{blockSize: blockSize, dim: dim, numBlocks: numBlocks, dtype: dtype, seqs: map[int]*sequence{},
		versions: make([]uint64, numBlocks), refs: make([]int32, numBlocks), shares: make([]int32, numBlocks)}
	switch dtype {
	case kernels.F32:
		c.f32 = make([]float32, numBlocks*blockSize*dim)
	case kernels.BF16, kernels.F16:
		c.u16 = make([]uint16, numBlocks*blockSize*dim)
	default:
		return nil, fmt.Errorf("attn: cache dtype %v (want F32, BF16 or F16)", dtype)
	}
	c.free = make([]int32, numBlocks)
	for i := range c.free {
		c.free[i] = int32(numBlocks - 1 - i) // block 0 is handed out first
	}
	return c, nil
}

func (c *Cache) BlockSize() int { return c.blockSize }
func (c *Cache) Dim() int       { return c.dim }
func (c *Cache) NumBlocks() int { return c.numBlocks }

// Block returns block i as a [blockSize, dim] matrix over the cache memory.
func (c *Cache) Block(i int) kernels.Matrix {
	n := c.blockSize * c.dim
	var m kernels.Matrix
	if c.dtype == kernels.F32 {
		m, _ = kernels.NewF32(c.blockSize, c.dim, c.f32[i*n:(i+1)*n])
	} else {
		m, _ = kernels.NewHalf(c.dtype, c.blockSize, c.dim, c.u16[i*n:(i+1)*n])
	}
	return m
}

// Append adds rows [n, dim] to sequence seq (created on first use),
// taking new blocks as needed. If the cache has too few free blocks it
// returns an error and changes nothing.
func (c *Cache) Append(seq int, rows []float32) error {
	if len(rows)%c.dim != 0 {
		return fmt.Errorf("attn: %d values are not whole rows of %d", len(rows), c.dim)
	}
	n := len(rows) / c.dim
	if err := c.checkRows(rows, fmt.Sprintf("sequence %d", seq)); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s, err := c.grow(seq, n)
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		pos := s.len + i
		blk := int(s.blocks[pos/c.blockSize])
		c.versions[blk]++
		off := (blk*c.blockSize + pos%c.blockSize) * c.dim
		src := rows[i*c.dim : (i+1)*c.dim]
		c.store(off, src)
	}
	s.len += n
	return nil
}

// store writes the row src at c's value offset off in c's dtype (bf16 and
// fp16 rounded to nearest even); the lock is held.
func (c *Cache) store(off int, src []float32) {
	switch c.dtype {
	case kernels.F32:
		copy(c.f32[off:off+len(src)], src)
	case kernels.BF16:
		for j, v := range src {
			c.u16[off+j] = half.F32ToBF16(v)
		}
	default:
		for j, v := range src {
			c.u16[off+j] = half.F32ToF16(v)
		}
	}
}

// checkRows refuses rows holding NaN or ±Inf, or (in a bf16 or fp16
// cache) a finite value that rounds to infinity there: such a row would
// make every later attention over it NaN.
func (c *Cache) checkRows(rows []float32, what string) error {
	for i, v := range rows {
		bad := v-v != 0 // NaN or ±Inf
		// Both round to nearest even: bf16 from 0x7F7F8000 up a
		// magnitude rounds to infinity, fp16 from 65520 (its largest
		// value, 65504, has an odd mantissa).
		overflow, name := false, ""
		switch c.dtype {
		case kernels.BF16:
			overflow, name = !bad && math.Float32bits(v)&0x7fffffff >= 0x7f7f8000, "bf16"
		case kernels.F16:
			overflow, name = !bad && math.Abs(float64(v)) >= 65520, "fp16"
		}
		switch {
		case bad:
			return errkind.Errorf(ErrNonFinite, "attn: latent row %d of %s holds %v at column %d", i/c.dim, what, v, i%c.dim)
		case overflow:
			return errkind.Errorf(ErrNonFinite, "attn: latent row %d of %s holds %v at column %d, past %s's range", i/c.dim, what, v, i%c.dim, name)
		}
	}
	return nil
}

// grow gives sequence seq (created on first use) the blocks for n more
// rows, or an error and no change when too few are free; the lock is held.
// The caller writes the rows and their length.
func (c *Cache) grow(seq, n int) (*sequence, error) {
	s := c.seqs[seq]
	if s == nil {
		s = &sequence{}
		c.seqs[seq] = s
	}
	need := (s.len+n+c.blockSize-1)/c.blockSize - len(s.blocks)
	if need > len(c.free) {
		if s.len == 0 {
			delete(c.seqs, seq)
		}
		return nil, errkind.Errorf(ErrCacheExhausted, "attn: cache exhausted: sequence %d needs %d more blocks, %d of %d are free",
			seq, need, len(c.free), c.numBlocks)
	}
	for ; need > 0; need-- {
		b := c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
		c.refs[b] = 1
		s.blocks = append(s.blocks, b)
	}
	return s, nil
}

// unref drops a reference on block b, freeing it with the last; the lock
// is held.
func (c *Cache) unref(b int32) {
	c.refs[b]--
	if c.refs[b] == 0 {
		c.free = append(c.free, b)
	}
}

// Share takes a reference on blocks [from, to) of sequence seq's table,
// which must be whole (to·BlockSize ≤ its length), and returns them: the
// holder (a prefix cache) keeps them past the sequence's end, until it
// Releases them.
func (c *Cache) Share(seq, from, to int) ([]int32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.seqs[seq]
	n := c.lenLocked(seq)
	if s == nil || from < 0 || from > to || to*c.blockSize > n {
		return nil, fmt.Errorf("attn: sharing blocks [%d, %d) of sequence %d: it holds %d whole blocks", from, to, seq, n/c.blockSize)
	}
	out := append([]int32(nil), s.blocks[from:to]...)
	for _, b := range out {
		c.refs[b]++
		c.shares[b]++
	}
	return out, nil
}

// Attach makes sequence seq, which must not be in the cache, start with
// blocks (shared ones, each held by a Share reference) as its first
// len(blocks)·BlockSize rows, taking a reference on each. Its later rows go
// to blocks of its own.
func (c *Cache) Attach(seq int, blocks []int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seqs[seq]; ok {
		return fmt.Errorf("attn: attaching blocks to sequence %d, which is in the cache already", seq)
	}
	if err := c.checkHeld(blocks); err != nil {
		return fmt.Errorf("attn: attaching to sequence %d: %w", seq, err)
	}
	if len(blocks) == 0 {
		return nil
	}
	for _, b := range blocks {
		c.refs[b]++
	}
	c.seqs[seq] = &sequence{blocks: append([]int32(nil), blocks...), len: len(blocks) * c.blockSize}
	return nil
}

// Release drops a reference (a Share's) on each of blocks; a block whose
// last reference goes is free.
func (c *Cache) Release(blocks []int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkHeld(blocks); err != nil {
		return fmt.Errorf("attn: releasing: %w", err)
	}
	for _, b := range blocks {
		c.shares[b]--
		c.unref(b)
	}
	return nil
}

// checkHeld refuses blocks out of range or not shared (held by fewer Share
// references than they appear in blocks); the lock is held.
func (c *Cache) checkHeld(blocks []int32) error {
	seen := map[int32]int32{}
	for _, b := range blocks {
		if b < 0 || int(b) >= c.numBlocks {
			return fmt.Errorf("block %d out of range [0, %d)", b, c.numBlocks)
		}
		seen[b]++
		if seen[b] > c.shares[b] {
			return fmt.Errorf("block %d is shared %d times, fewer than it is given", b, c.shares[b])
		}
	}
	return nil
}

// Refs is the references block b has (0: free).
func (c *Cache) Refs(b int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b < 0 || b >= c.numBlocks {
		return 0
	}
	return int(c.refs[b])
}

// Reserve extends sequence seq (created on first use) by n rows whose
// values a device copy of the cache computes and writes (a decode step on
// the device), taking blocks as needed, and returns each row's slot
// (block·BlockSize + row in the block). Here the rows keep whatever their
// blocks held until Fill gives them their values, and their blocks are not
// marked changed, so a device copy's sync does not overwrite them. If the
// cache has too few free blocks it returns an error and changes nothing;
// Truncate undoes it.
func (c *Cache) Reserve(seq, n int) ([]int32, error) {
	if n < 0 {
		return nil, fmt.Errorf("attn: reserving %d rows", n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s, err := c.grow(seq, n)
	if err != nil {
		return nil, err
	}
	slots := make([]int32, n)
	for i := range slots {
		pos := s.len + i
		slots[i] = s.blocks[pos/c.blockSize]*int32(c.blockSize) + int32(pos%c.blockSize)
	}
	s.len += n
	return slots, nil
}

// Fill writes rows [len(slots), dim], already written at slots (from
// Reserve) in a device copy, into the host memory, stored as the cache's
// dtype (bf16 rounded to nearest even, as on the device), and marks their
// blocks changed, so that any other copy (a new one included) gets them.
// seen (nil: none) are the writing copy's block versions (as Changed keeps
// them): a block it was up to date with stays so, since it holds the rows
// already.
func (c *Cache) Fill(slots []int32, rows []float32, seen []uint64) error {
	if len(rows) != len(slots)*c.dim {
		return fmt.Errorf("attn: fill: %d values for %d rows of %d", len(rows), len(slots), c.dim)
	}
	if seen != nil && len(seen) != c.numBlocks {
		return fmt.Errorf("attn: fill: %d block versions for a cache of %d blocks", len(seen), c.numBlocks)
	}
	for _, slot := range slots {
		if slot < 0 || int(slot) >= c.numBlocks*c.blockSize {
			return fmt.Errorf("attn: fill: slot %d out of range [0, %d)", slot, c.numBlocks*c.blockSize)
		}
	}
	if err := c.checkRows(rows, "a fill"); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, slot := range slots {
		blk := int(slot) / c.blockSize
		current := seen != nil && seen[blk] == c.versions[blk]
		c.versions[blk]++
		if current {
			seen[blk] = c.versions[blk]
		}
		off := int(slot) * c.dim
		src := rows[i*c.dim : (i+1)*c.dim]
		c.store(off, src)
	}
	return nil
}

// Truncate shortens sequence seq to its first n rows (n ≤ its length),
// releasing the blocks past them: how a step that reserved rows and then
// failed takes them back. A sequence truncated to nothing is removed. It
// may not end inside a shared block (which the sequence would then write).
func (c *Cache) Truncate(seq, n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.seqs[seq]
	if !ok || n < 0 || n > s.len {
		return fmt.Errorf("attn: truncating sequence %d to %d rows: it has %d", seq, n, c.lenLocked(seq))
	}
	keep := (n + c.blockSize - 1) / c.blockSize
	if n%c.blockSize != 0 && c.refs[s.blocks[keep-1]] > 1 {
		// Its later rows would be written into a block others read.
		return fmt.Errorf("attn: truncating sequence %d to %d rows would cut into block %d, which is shared", seq, n, s.blocks[keep-1])
	}
	for i := len(s.blocks) - 1; i >= keep; i-- {
		c.unref(s.blocks[i])
	}
	s.blocks, s.len = s.blocks[:keep], n
	if n == 0 {
		delete(c.seqs, seq)
	}
	return nil
}

func (c *Cache) lenLocked(seq int) int {
	if s := c.seqs[seq]; s != nil {
		return s.len
	}
	return 0
}

// Free releases sequence seq's blocks for reuse.
func (c *Cache) Free(seq int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.seqs[seq]
	if !ok {
		return fmt.Errorf("attn: sequence %d is not in the cache", seq)
	}
	for i := len(s.blocks) - 1; i >= 0; i-- {
		c.unref(s.blocks[i])
	}
	delete(c.seqs, seq)
	return nil
}

// FreeBlocks is the number of blocks nothing holds.
func (c *Cache) FreeBlocks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.free)
}

// Len is the number of rows sequence seq holds (0 if unknown).
func (c *Cache) Len(seq int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.seqs[seq]; s != nil {
		return s.len
	}
	return 0
}

// BlockTable returns a copy of sequence seq's block table.
func (c *Cache) BlockTable(seq int) []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.seqs[seq]; s != nil {
		return append([]int32(nil), s.blocks...)
	}
	return nil
}

// BytesUsed is the memory of the blocks in use; BytesTotal of all blocks.
func (c *Cache) BytesUsed() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(c.numBlocks-len(c.free)) * c.blockBytes()
}

// BytesTotal is the memory of every block of the cache.
func (c *Cache) BytesTotal() int64 { return int64(c.numBlocks) * c.blockBytes() }

func (c *Cache) blockBytes() int64 {
	return int64(c.blockSize) * int64(c.dim) * int64(c.dtype.Size())
}

// DenseBlocks views a dense cache [numBlocks, blockSize, dim] (as
// `exec mla-decode` reads it) as Blocks, without copying.
type DenseBlocks struct {
	Data                      []float32
	NBlocks, BlockRows, Width int
}

func (d DenseBlocks) BlockSize() int { return d.BlockRows }
func (d DenseBlocks) Dim() int       { return d.Width }
func (d DenseBlocks) NumBlocks() int { return d.NBlocks }
func (d DenseBlocks) Block(i int) kernels.Matrix {
	n := d.BlockRows * d.Width
	m, _ := kernels.NewF32(d.BlockRows, d.Width, d.Data[i*n:(i+1)*n])
	return m
}
