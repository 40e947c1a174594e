// Package half converts between float32 and the 16-bit float formats that
// checkpoints store: bfloat16 and IEEE 754 binary16 (fp16). Narrowing rounds
// to nearest, ties to even; NaN stays NaN (quiet) and infinities stay
// infinite.
package half

import "math"

// BF16ToF32 widens a bfloat16 bit pattern to float32. It is exact.
func BF16ToF32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// F32ToBF16 narrows f to bfloat16, rounding to nearest even.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN: keep sign and top payload bits, force quiet
		return uint16(u>>16) | 0x0040
	}
	// Adding 0x7fff plus the lowest kept bit rounds half to even; a carry
	// into the exponent is the correct result (up to and including Inf).
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// F16ToF32 widens an IEEE binary16 bit pattern to float32. It is exact.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0: // signed zero
		return math.Float32frombits(sign)
	}
	// Subnormal: shift the mantissa up until its leading one reaches the
	// implicit position, lowering the exponent as it goes.
	e := uint32(113)
	for man&0x400 == 0 {
		man <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
}

// F32ToF16 narrows f to IEEE binary16, rounding to nearest even. Values at
// or above 65520 in magnitude become infinities; tiny values become
// subnormals or signed zero.
func F32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	abs := u & 0x7fffffff
	switch {
	case abs > 0x7f800000: // NaN
		return sign | 0x7e00 | uint16(abs>>13)&0x3ff
	case abs >= 0x477ff000: // ≥ 65520 rounds to Inf (and Inf itself)
		return sign | 0x7c00
	case abs >= 0x38800000: // normal in fp16 (≥ 2^-14)
		// Rebias the exponent (127 → 15) and round the 13 dropped bits half to even.
		v := abs - (112 << 23)
		v += 0xfff + (v>>13)&1
		return sign | uint16(v>>13)
	case abs < 0x33000000: // < 2^-25: rounds to zero (2^-25 itself ties to even zero)
		return sign
	}
	// Subnormal result: the value is man·2^(exp-150) with the implicit bit;
	// the fp16 subnormal unit is 2^-24, so shift right by 126-exp.
	exp := abs >> 23
	man := abs&0x7fffff | 0x800000
	shift := 126 - exp
	half := uint32(1) << (shift - 1)
	rest := man & (1<<shift - 1)
	r := man >> shift
	if rest > half || (rest == half && r&1 == 1) {
		r++ // may carry into the smallest normal, which is correct
	}
	return sign | uint16(r)
}

// BF16SliceToF32 widens src into dst; dst must be at least as long as src.
func BF16SliceToF32(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
}

// F16SliceToF32 widens src into dst; dst must be at least as long as src.
func F16SliceToF32(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = F16ToF32(h)
	}
}
