//go:build cuda || cudaemu

package dpattngpu

import (
	"fmt"

	"github.com/moex-project/moex/cuda"
)

// MLAInput is an MLA decode batch as `moex exec mla-decode` takes it: q
// [batch, heads, D], a dense paged cache [blocks, BlockSize, D] as fp32
// (CacheF32) or bf16 bits (CacheBF16), a block table [batch, MaxBlocks]
// and lengths [batch].
type MLAInput struct {
	Q                    []float32
	CacheF32             []float32
	CacheBF16            []uint16
	BlockSize, D         int
	BlockTable           []int32
	MaxBlocks            int
	SeqLens              []int32
	Heads, DV, SplitRows int
	Scale                float32
	// Grouped-query attention (KVHeads > 0; MLA otherwise): Q [batch,
	// Heads, KeyDim], head h's key the KeyDim values from g·KeyDim of a
	// row (g = h / (Heads/KVHeads)), its value the DV values from ValueOff
	// + g·DV; Window > 0 the last Window rows; Sinks, one a head (nil:
	// none), in each softmax's denominator.
	KVHeads, KeyDim, ValueOff, Window int
	Sinks                             []float32
}

// keyDim is a query's width: the row's (MLA) or a key head's.
func (in *MLAInput) keyDim() int {
	if in.KVHeads > 0 {
		return in.KeyDim
	}
	return in.D
}

// MLADecode runs MLA decode on the device: out [batch, heads, dv] and lse
// [batch, heads], the contract of attn.MLA.
func MLADecode(d cuda.Launcher, in MLAInput) (out, lse []float32, err error) {
	n := len(in.CacheF32)
	if in.CacheBF16 != nil {
		n = len(in.CacheBF16)
	}
	if in.BlockSize < 1 || in.D < 1 || n%(in.BlockSize*in.D) != 0 {
		return nil, nil, fmt.Errorf("cuda: mla decode: the cache has %d values, not whole blocks of %d × %d", n, in.BlockSize, in.D)
	}
	if err := in.check(n / (in.BlockSize * in.D)); err != nil {
		return nil, nil, err
	}
	bs := cuda.NewBuffers(d)
	defer bs.Free()
	var cache cuda.Buffer
	if in.CacheBF16 != nil {
		cache = bs.Put(cuda.Upload(d, in.CacheBF16))
	} else {
		cache = bs.Put(cuda.Upload(d, in.CacheF32))
	}
	if bs.Err() != nil {
		return nil, nil, bs.Err()
	}
	return mlaDecode(d, cache, in.CacheBF16 != nil, in)
}

// check checks the batch's shapes, lengths and block-table entries against
// a cache of nBlocks blocks.
func (in *MLAInput) check(nBlocks int) error {
	B := len(in.SeqLens)
	if in.Heads < 1 || in.DV < 1 || in.DV > in.D || in.DV > 1024 || in.SplitRows < 1 || len(in.Q) != B*in.Heads*in.keyDim() ||
		len(in.BlockTable) != B*in.MaxBlocks {
		return fmt.Errorf("cuda: mla decode: bad shapes (batch %d, heads %d, D %d, dv %d)", B, in.Heads, in.D, in.DV)
	}
	if g := in.KVHeads; g > 0 && (in.Heads%g != 0 || in.KeyDim < 1 || g*in.KeyDim > in.D || in.ValueOff+g*in.DV > in.D ||
		in.Window < 0 || (in.Sinks != nil && len(in.Sinks) != in.Heads)) {
		return fmt.Errorf("cuda: attention decode: bad grouped-query shapes (heads %d over %d, key %d, value %d from %d, row %d, %d sinks)",
			in.Heads, g, in.KeyDim, in.DV, in.ValueOff, in.D, len(in.Sinks))
	}
	for b, l := range in.SeqLens {
		if l < 1 || int(l) > in.MaxBlocks*in.BlockSize {
			return fmt.Errorf("cuda: mla decode: sequence %d has length %d, the block table holds %d rows", b, l, in.MaxBlocks*in.BlockSize)
		}
		for i, blk := range in.BlockTable[b*in.MaxBlocks:][:(int(l)+in.BlockSize-1)/in.BlockSize] {
			if blk < 0 || int(blk) >= nBlocks {
				return fmt.Errorf("cuda: mla decode: query %d: block table entry %d is %d, out of range [0, %d)", b, i, blk, nBlocks)
			}
		}
	}
	return nil
}

// mlaDecode runs a checked batch over a cache already on the device (its
// Cache fields are not read).
func mlaDecode(d cuda.Launcher, cache cuda.Buffer, bf16 bool, in MLAInput) (out, lse []float32, err error) {
	sc := cuda.NewScratch(d)
	defer sc.Free()
	return mlaDecodeIn(d, sc, cache, bf16, in)
}

// mlaDecodeIn is mlaDecode with its device temporaries in sc.
func mlaDecodeIn(d cuda.Launcher, sc *cuda.Scratch, cache cuda.Buffer, bf16 bool, in MLAInput) (out, lse []float32, err error) {
	B := len(in.SeqLens)
	maxLen := 1
	for _, l := range in.SeqLens {
		maxLen = max(maxLen, int(l))
	}
	if in.Window > 0 {
		maxLen = min(maxLen, in.Window)
	}
	splits := (maxLen + in.SplitRows - 1) / in.SplitRows
	out, lse = make([]float32, B*in.Heads*in.DV), make([]float32, B*in.Heads)
	if B == 0 {
		return out, lse, nil
	}
	var buf [8]cuda.Buffer
	for i, bytes := range []int64{int64(len(in.Q) * 4), int64(len(in.BlockTable) * 4), int64(len(in.SeqLens) * 4),
		int64(B * in.Heads * splits * in.DV * 4), int64(B * in.Heads * splits * 4), int64(len(out) * 4), int64(len(lse) * 4),
		int64(max(1, len(in.Sinks)) * 4)} {
		if buf[i], err = sc.At(i, bytes); err != nil {
			return nil, nil, err
		}
	}
	q, bt, sl, partO, partL, o, l := buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6]
	var sinks cuda.Buffer
	for _, f := range []func() error{
		func() error { return cuda.CopyIn(d, q, in.Q) },
		func() error { return cuda.CopyIn(d, bt, in.BlockTable) },
		func() error { return cuda.CopyIn(d, sl, in.SeqLens) },
	} {
		if err := f(); err != nil {
			return nil, nil, err
		}
	}
	if in.Sinks != nil {
		sinks = buf[7]
		if err := cuda.CopyIn(d, sinks, in.Sinks); err != nil {
			return nil, nil, err
		}
	}
	if err := d.AttnDecode(cuda.AttnDecodeArgs{BF16: bf16, Q: q, Cache: cache, BlockTable: bt, SeqLens: sl, Batch: B, Heads: in.Heads,
		Dim: in.D, ValueDim: in.DV, KVHeads: in.KVHeads, KeyDim: in.KeyDim, ValueOff: in.ValueOff, Window: in.Window,
		BlockSize: in.BlockSize, MaxBlocks: in.MaxBlocks, SplitRows: in.SplitRows, Splits: splits, Scale: in.Scale, Sinks: sinks,
		PartO: partO, PartL: partL, Out: o, LSE: l}); err != nil {
		return nil, nil, err
	}
	if err := cuda.Download(d, o, out); err != nil {
		return nil, nil, err
	}
	return out, lse, cuda.Download(d, l, lse)
}
