//go:build !cgo

package main

// gpuReport: NVML needs cgo, which this build lacks.
func gpuReport() []string {
	return []string{"not probed: this moex was built without cgo (NVML needs it)"}
}
