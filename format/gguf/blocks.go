package gguf

import (
	"encoding/binary"
	"fmt"

	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
)

// ggml's integer-code blocks (ggml-common.h's block_q8_0 … block_q6_K and
// ggml-quants.c's dequantize_row_*) as kernels' integer-code matrices:
// each value a code times its group's scale plus its group's offset, the
// one rounding ggml's own (its products are exact in fp32; Q6_K's scaled
// code rounds once, as ggml's d·sc·q does). 4-bit codes stay nibbles
// (UINT4); 5-, 6- and 8-bit ones are held a byte a code (INT8).

// intBlock describes one block type: values a block, values a scale
// group, whether its codes are unsigned nibbles, whether it has offsets,
// and decode, which writes a block's codes (len values), its groups'
// scales and, with offsets, their offsets.
type intBlock struct {
	values, group int
	nibbles       bool
	offsets       bool
	decode        func(b []byte, codes []int8, scales, offs []float32)
	// factors, for the K-quants, writes a block's d (and dmin) and its
	// groups' int8 factors sc (and m): its scales are d·sc, its offsets
	// −dmin·m (see kernels.WithSuperScales).
	factors func(b []byte, d, dmin []float32, sc, m []int8)
}

func f16At(b []byte) float32 { return half.F16ToF32(binary.LittleEndian.Uint16(b)) }

// kScaleMin is scale and min j (0…7) of a Q4_K or Q5_K block's 12 packed
// bytes: 6 bits each, the first four in the low bits of bytes 0…7, the
// last four split between the low and high nibbles of bytes 8…11 and the
// top two bits of bytes 0…7 (ggml's get_scale_min_k4).
func kScaleMin(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xF | q[j-4]>>6<<4, q[j+4]>>4 | q[j]>>6<<4
}

var intBlocks = map[Type]intBlock{
	// Q8_0: d (f16), 32 int8 codes; value code·d.
	Q8_0: {32, 32, false, false, func(b []byte, codes []int8, scales, _ []float32) {
		scales[0] = f16At(b)
		for j := range 32 {
			codes[j] = int8(b[2+j])
		}
	}, nil},
	// Q4_1: d, m (f16), 16 bytes of nibbles (value j low, j+16 high);
	// value q·d + m.
	Q4_1: {32, 32, true, true, func(b []byte, codes []int8, scales, offs []float32) {
		scales[0], offs[0] = f16At(b), f16At(b[2:])
		for j, q := range b[4:20] {
			codes[j], codes[j+16] = int8(q&15), int8(q>>4)
		}
	}, nil},
	// Q5_0: d, a 32-bit word of fifth bits (bit j for value j), nibbles as
	// Q4_0's; value (q − 16)·d.
	Q5_0: {32, 32, false, false, func(b []byte, codes []int8, scales, _ []float32) {
		scales[0] = f16At(b)
		qh := binary.LittleEndian.Uint32(b[2:])
		for j, q := range b[6:22] {
			codes[j] = int8(q&15|uint8(qh>>j&1)<<4) - 16
			codes[j+16] = int8(q>>4|uint8(qh>>(j+16)&1)<<4) - 16
		}
	}, nil},
	// Q5_1: d, m, the fifth bits, the nibbles; value q·d + m.
	Q5_1: {32, 32, false, true, func(b []byte, codes []int8, scales, offs []float32) {
		scales[0], offs[0] = f16At(b), f16At(b[2:])
		qh := binary.LittleEndian.Uint32(b[4:])
		for j, q := range b[8:24] {
			codes[j] = int8(q&15 | uint8(qh>>j&1)<<4)
			codes[j+16] = int8(q>>4 | uint8(qh>>(j+16)&1)<<4)
		}
	}, nil},
	// Q4_K: d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of
	// nibbles: each 64 values, bytes 32i…32i+31 give values 64i+l (low)
	// and 64i+32+l (high), groups 2i and 2i+1; value q·(d·sc) − dmin·m.
	Q4_K: {256, 32, true, true, func(b []byte, codes []int8, scales, offs []float32) {
		kQuant(b, b[16:144], nil, codes, scales, offs)
	}, kFactors},
	// Q5_K: Q4_K with 32 bytes of fifth bits before the nibbles: bit 2i of
	// byte l for value 64i+l, bit 2i+1 for 64i+32+l.
	Q5_K: {256, 32, false, true, func(b []byte, codes []int8, scales, offs []float32) {
		kQuant(b, b[48:176], b[16:48], codes, scales, offs)
	}, kFactors},
	// Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8
	// scales, d (f16); each 128 values n, for l < 32: values l, l+32,
	// l+64, l+96 from nibbles ql[l] low, ql[l+32] low, ql[l] high, ql[l+32]
	// high and bit pairs 0, 2, 4, 6 of qh[l]; value (q − 32)·(d·sc), sc
	// the one of its 16 values.
	Q6_K: {256, 16, false, false, func(b []byte, codes []int8, scales, _ []float32) {
		d := f16At(b[208:])
		for g := range 16 {
			scales[g] = d * float32(int8(b[192+g]))
		}
		for n := range 2 {
			ql, qh, c := b[64*n:], b[128+32*n:], codes[128*n:]
			for l := range 32 {
				c[l] = int8(ql[l]&15|(qh[l]>>0&3)<<4) - 32
				c[l+32] = int8(ql[l+32]&15|(qh[l]>>2&3)<<4) - 32
				c[l+64] = int8(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
				c[l+96] = int8(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32
			}
		}
	}, func(b []byte, d, _ []float32, sc, _ []int8) {
		d[0] = f16At(b[208:])
		for g := range 16 {
			sc[g] = int8(b[192+g])
		}
	}},
}

// kFactors writes a Q4_K or Q5_K block's factors.
func kFactors(b []byte, d, dmin []float32, sc, m []int8) {
	d[0], dmin[0] = f16At(b), f16At(b[2:])
	for g := range 8 {
		s, mn := kScaleMin(g, b[4:16])
		sc[g], m[g] = int8(s), int8(mn)
	}
}

// kQuant decodes a Q4_K (qh nil) or Q5_K block whose nibbles are qs.
func kQuant(b, qs, qh []byte, codes []int8, scales, offs []float32) {
	d, dmin := f16At(b), f16At(b[2:])
	for g := range 8 {
		sc, m := kScaleMin(g, b[4:16])
		scales[g], offs[g] = d*float32(sc), -(dmin * float32(m))
	}
	for i := range 4 {
		for l := range 32 {
			lo, hi := qs[32*i+l]&15, qs[32*i+l]>>4
			if qh != nil {
				lo |= qh[l] >> (2 * i) & 1 << 4
				hi |= qh[l] >> (2*i + 1) & 1 << 4
			}
			codes[64*i+l], codes[64*i+32+l] = int8(lo), int8(hi)
		}
	}
}

// codeBlocks is matrix k ([rows, cols]) of tensor t, in one of the
// intBlocks types, as a kernels UINT4 or INT8 matrix (a copy).
func codeBlocks(t TensorInfo, data []byte, k, rows, cols int) (kernels.Matrix, error) {
	ib := intBlocks[t.Type]
	bb := int(t.Type.BlockBytes())
	perRow := cols / ib.values
	blocks := data[k*rows*perRow*bb:][:rows*perRow*bb]
	groups := rows * cols / ib.group
	scales := make([]float32, groups)
	var offs []float32
	if ib.offsets {
		offs = make([]float32, groups)
	}
	codes := make([]int8, rows*cols)
	gpb := ib.values / ib.group // groups a block
	for b := 0; b < rows*perRow; b++ {
		var o []float32
		if offs != nil {
			o = offs[b*gpb:][:gpb]
		}
		ib.decode(blocks[b*bb:][:bb], codes[b*ib.values:][:ib.values], scales[b*gpb:][:gpb], o)
	}
	var m kernels.Matrix
	var err error
	if ib.nibbles {
		packed := make([]uint8, rows*cols/2)
		for i, c := range codes {
			packed[i/2] |= uint8(c) << (4 * (i & 1))
		}
		m, err = kernels.NewUINT4(rows, cols, ib.group, packed, scales, offs)
	} else {
		m, err = kernels.NewINT8(rows, cols, ib.group, codes, scales, offs)
	}
	if err != nil {
		return m, fmt.Errorf("tensor %q (%s): %w", t.Name, t.Type, err)
	}
	if ib.factors != nil {
		if m, err = superScales(ib, blocks, bb, rows*perRow, m); err != nil {
			return m, fmt.Errorf("tensor %q (%s): %w", t.Name, t.Type, err)
		}
	}
	return m, nil
}

// superScales gives m (made from n blocks of ib's K-quant type) the
// blocks' factored scales.
func superScales(ib intBlock, blocks []byte, bb, n int, m kernels.Matrix) (kernels.Matrix, error) {
	gpb := ib.values / ib.group
	d, sc := make([]float32, n), make([]int8, n*gpb)
	var dmin []float32
	var mins []int8
	if ib.offsets {
		dmin, mins = make([]float32, n), make([]int8, n*gpb)
	}
	for b := range n {
		var dm []float32
		var mn []int8
		if ib.offsets {
			dm, mn = dmin[b:b+1], mins[b*gpb:][:gpb]
		}
		ib.factors(blocks[b*bb:][:bb], d[b:b+1], dm, sc[b*gpb:][:gpb], mn)
	}
	return kernels.WithSuperScales(m, gpb, d, dmin, sc, mins)
}
