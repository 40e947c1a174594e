package gguf

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/internal/half"
)

// Encodable reports whether Encode writes type t.
func Encodable(t Type) bool {
	switch t {
	case F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K, MXFP4:
		return true
	}
	return false
}

// Encode returns the rows×cols matrix v (row-major, a row of cols values
// along ggml's contiguous dimension) as the blocks of ggml type t, laid
// out as ggml-common.h's block structs are and as Model.Matrix reads
// them back: F32, F16 and BF16 (rounded to nearest even); Q8_0 (scale
// max|v|/127, each code round(v/scale)); Q4_0 (ggml's: the value of
// largest magnitude m gives the scale −m/8, each code the nearest of
// 0…15 after the offset 8); Q4_K (groups of 32 with a scale and a min ≤
// 0 spanning the group's range, factored over super-blocks of 8 as
// 6-bit multiples of two f16 factors, codes the nearest of 0…15); Q6_K
// (groups of 16, a group's scale max|v|/31 a signed 8-bit multiple of an
// f16 factor, codes the nearest of −32…31); MXFP4 (a power-of-two scale
// per 32 that brings the block's largest magnitude within e2m1's 6, each
// value the nearest e2m1, ties to the even one). The rounding is plain
// nearest, not ggml's search for the scales of least error. cols must be a
// multiple of t's block size; other types are an ErrUnsupported error.
func Encode(t Type, v []float32, rows, cols int) ([]byte, error) {
	bs := int(t.BlockSize())
	switch {
	case !Encodable(t):
		return nil, fmt.Errorf("gguf: encode as %v: %w (moex writes F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K and MXFP4)", t, format.ErrUnsupported)
	case rows < 0 || cols < 0 || len(v) != rows*cols:
		return nil, fmt.Errorf("gguf: encode: %d values for a matrix [%d, %d]", len(v), rows, cols)
	case cols%bs != 0:
		return nil, fmt.Errorf("gguf: encode as %v: rows of %d values are not whole blocks of %d", t, cols, bs)
	}
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("gguf: encode: value %d is %v", i, x)
		}
	}
	n := len(v) / bs
	out := make([]byte, n*int(t.BlockBytes()))
	bb := int(t.BlockBytes())
	for i := range n {
		b, x := out[i*bb:][:bb], v[i*bs:][:bs]
		switch t {
		case F32:
			binary.LittleEndian.PutUint32(b, math.Float32bits(x[0]))
		case F16:
			binary.LittleEndian.PutUint16(b, half.F32ToF16(x[0]))
		case BF16:
			binary.LittleEndian.PutUint16(b, half.F32ToBF16(x[0]))
		case Q8_0:
			encodeQ8_0(b, x)
		case Q4_0:
			encodeQ4_0(b, x)
		case Q4_K:
			encodeQ4K(b, x)
		case Q6_K:
			encodeQ6K(b, x)
		case MXFP4:
			encodeMXFP4(b, x)
		}
	}
	return out, nil
}

// putF16 writes x as f16 at b and returns the f16 value as fp32.
func putF16(b []byte, x float64) float32 {
	h := half.F32ToF16(float32(x))
	binary.LittleEndian.PutUint16(b, h)
	return half.F16ToF32(h)
}

func absMax(x []float32) float64 {
	var m float64
	for _, v := range x {
		m = math.Max(m, math.Abs(float64(v)))
	}
	return m
}

// clampRound is round-half-even(x) held within lo…hi.
func clampRound(x float64, lo, hi int) int {
	return int(max(float64(lo), min(float64(hi), math.RoundToEven(x))))
}

func encodeQ8_0(b []byte, x []float32) {
	d := putF16(b, absMax(x)/127)
	if d == 0 {
		return
	}
	for j, v := range x {
		b[2+j] = byte(int8(clampRound(float64(v)/float64(d), -127, 127)))
	}
}

func encodeQ4_0(b []byte, x []float32) {
	var m float64 // the value of largest magnitude, with its sign
	for _, v := range x {
		if math.Abs(float64(v)) > math.Abs(m) {
			m = float64(v)
		}
	}
	d := putF16(b, m/-8)
	for j := range 16 {
		lo, hi := 8, 8
		if d != 0 {
			lo = clampRound(float64(x[j])/float64(d)+8, 0, 15)
			hi = clampRound(float64(x[j+16])/float64(d)+8, 0, 15)
		}
		b[2+j] = byte(lo | hi<<4)
	}
}

// encodeQ4K writes one Q4_K block (256 values): d, dmin, the 12 bytes of
// 6-bit scales and mins (get_scale_min_k4's packing), the nibbles (each
// 64 values: bytes 32i…32i+31 hold values 64i+l low and 64i+32+l high).
func encodeQ4K(b []byte, x []float32) {
	var ranges, mins [8]float64
	var rmax, mmax float64
	for g := range 8 {
		lo, hi := 0.0, math.Inf(-1)
		for _, v := range x[32*g:][:32] {
			lo, hi = math.Min(lo, float64(v)), math.Max(hi, float64(v))
		}
		ranges[g], mins[g] = (hi-lo)/15, -lo
		rmax, mmax = math.Max(rmax, ranges[g]), math.Max(mmax, mins[g])
	}
	d, dmin := putF16(b, rmax/63), putF16(b[2:], mmax/63)
	var sc, mn [8]int
	for g := range 8 {
		if d > 0 { // the ceiling, so that the group's range fits
			sc[g] = int(min(63, math.Ceil(ranges[g]/float64(d))))
		}
		if dmin > 0 {
			mn[g] = int(min(63, math.Ceil(mins[g]/float64(dmin))))
		}
	}
	s := b[4:16]
	for g := range 8 {
		if g < 4 {
			s[g], s[g+4] = byte(sc[g]), byte(mn[g])
			continue
		}
		s[g+4] = byte(sc[g]&15 | (mn[g]&15)<<4)
		s[g-4] |= byte(sc[g] >> 4 << 6)
		s[g] |= byte(mn[g] >> 4 << 6)
	}
	qs := b[16:144]
	for g := range 8 {
		scale, off := d*float32(sc[g]), -(dmin * float32(mn[g])) // as the decoder forms them
		for l, v := range x[32*g:][:32] {
			q := 0
			if scale != 0 {
				q = clampRound((float64(v)-float64(off))/float64(scale), 0, 15)
			}
			qs[32*(g/2)+l] |= byte(q << (4 * (g & 1)))
		}
	}
}

// encodeQ6K writes one Q6_K block (256 values): 128 bytes of low nibbles,
// 64 of high bit pairs, 16 int8 scales (one a group of 16), d; each 128
// values n, for l < 32: values l, l+32, l+64, l+96 in ql[l] low, ql[l+32]
// low, ql[l] high, ql[l+32] high and bit pairs 0, 2, 4, 6 of qh[l].
func encodeQ6K(b []byte, x []float32) {
	var scales [16]float64
	var smax float64
	for g := range 16 {
		scales[g] = absMax(x[16*g:][:16]) / 31
		smax = math.Max(smax, scales[g])
	}
	d := putF16(b[208:], smax/127)
	var codes [256]int
	for g := range 16 {
		sc := 0
		if d > 0 {
			sc = clampRound(scales[g]/float64(d), 0, 127)
		}
		b[192+g] = byte(int8(sc))
		scale := d * float32(sc)
		for j, v := range x[16*g:][:16] {
			q := 0
			if scale != 0 {
				q = clampRound(float64(v)/float64(scale), -32, 31)
			}
			codes[16*g+j] = q + 32
		}
	}
	for n := range 2 {
		ql, qh, c := b[64*n:], b[128+32*n:], codes[128*n:]
		for l := range 32 {
			q1, q2, q3, q4 := c[l], c[l+32], c[l+64], c[l+96]
			ql[l] = byte(q1&15 | (q3&15)<<4)
			ql[l+32] = byte(q2&15 | (q4&15)<<4)
			qh[l] = byte(q1>>4 | (q2>>4)<<2 | (q3>>4)<<4 | (q4>>4)<<6)
		}
	}
}

// e2m1 are the values of the 16 e2m1 codes.
var e2m1 = [16]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6}

// encodeMXFP4 writes one MXFP4 block (32 values): the e8m0 scale, then 16
// bytes holding value j in the low nibble of byte j and value j+16 in its
// high nibble.
func encodeMXFP4(b []byte, x []float32) {
	e := 0
	if m := absMax(x); m > 0 {
		e = int(math.Ceil(math.Log2(m / 6)))
	}
	e = max(-127, min(127, e))
	b[0] = byte(e + 127)
	inv := math.Ldexp(1, -e)
	nearest := func(v float64) byte {
		best, bestD := 0, math.Inf(1)
		for n, c := range e2m1 {
			if dd := math.Abs(c - v); dd < bestD || dd == bestD && n&1 == 0 && best&1 == 1 {
				best, bestD = n, dd
			}
		}
		return byte(best)
	}
	for j := range 16 {
		b[1+j] = nearest(float64(x[j])*inv) | nearest(float64(x[j+16])*inv)<<4
	}
}
