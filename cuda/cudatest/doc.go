// Package cudatest has the helpers of the GPU tests (build tag cuda).
package cudatest
