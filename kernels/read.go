package kernels

import "unsafe"

// readSIMD ORs n bytes at p (n a multiple of 512) into one word; nil where
// the implementation has none.
var readSIMD func(p *byte, n int) uint64

// ReadBytes reads every byte of b as fast as this machine can (on AVX-512:
// four accumulators and eight 64-byte loads a step) and returns the OR of
// its bytes, widened to words. It is the read-bandwidth probe the
// benchmarks compare with: a kernel streaming weights cannot beat it.
func ReadBytes(b []byte) uint64 {
	var acc uint64
	n := 0
	if readSIMD != nil && len(b) >= 512 {
		n = len(b) &^ 511
		acc = readSIMD(&b[0], n)
	}
	for ; n+8 <= len(b); n += 8 {
		acc |= *(*uint64)(unsafe.Pointer(&b[n]))
	}
	for ; n < len(b); n++ {
		acc |= uint64(b[n])
	}
	return acc
}
