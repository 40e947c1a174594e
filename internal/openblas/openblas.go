//go:build openblas && cgo

// Package openblas is OpenBLAS's sgemm, a baseline for the benchmarks
// (build tag openblas; needs libopenblas-dev).
package openblas

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>
void openblas_set_num_threads(int);
*/
import "C"

import "unsafe"

// Available reports whether this build links OpenBLAS.
const Available = true

// Sgemm computes c[m,n] = a[m,k]·b[n,k]ᵀ on the given number of threads.
func Sgemm(m, n, k int, a, b, c []float32, threads int) {
	C.openblas_set_num_threads(C.int(threads))
	C.cblas_sgemm(C.CblasRowMajor, C.CblasNoTrans, C.CblasTrans, C.int(m), C.int(n), C.int(k), 1,
		(*C.float)(unsafe.Pointer(&a[0])), C.int(k), (*C.float)(unsafe.Pointer(&b[0])), C.int(k), 0,
		(*C.float)(unsafe.Pointer(&c[0])), C.int(n))
}
