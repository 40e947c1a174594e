//go:build !amd64 || purego

package kernels

// Without assembly only the generic implementation registers.
