//go:build !(openblas && cgo)

// Package openblas is OpenBLAS's sgemm, a baseline for the benchmarks
// (build tag openblas; needs libopenblas-dev). This build does not link it.
package openblas

// Available reports whether this build links OpenBLAS.
const Available = false

// Sgemm is not available in this build.
func Sgemm(m, n, k int, a, b, c []float32, threads int) {
	panic("openblas: build with -tags openblas")
}
