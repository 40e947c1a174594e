//go:build !cuda && !cudaemu

package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestExecBackendCUDAMissing(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "moe", "mixtral_f32")
	_, _, err := runCLI("exec", "moe", "--backend", "cuda", "--model", dir, "--layer", "1", "--input", filepath.Join(dir, "x.npy"),
		"--out", filepath.Join(t.TempDir(), "y.npy"))
	require.ErrorIs(t, err, errNoCUDA)
	require.ErrorContains(t, err, "built without CUDA: build it with `make cuda`")
}

func TestRunBackendCUDAMissing(t *testing.T) {
	_, _, err := runCLI("run", "--backend", "cuda", "--steps", "1")
	require.ErrorIs(t, err, errNoCUDA)
	_, _, err = runCLI("run", "--backend", "tpu", "--steps", "1")
	require.ErrorContains(t, err, `--backend "tpu" (want cpu or cuda)`)
}

func TestBenchMoEBackendCUDAMissing(t *testing.T) {
	_, _, err := runCLI("bench", "moe", "--backend", "cuda", "--preset", "deepseek-v2-lite", "--tokens", "1")
	require.ErrorIs(t, err, errNoCUDA)
}

func TestRunCommErrors(t *testing.T) {
	_, _, err := runCLI("run", "--comm", "carrier-pigeon", "--steps", "1")
	require.ErrorContains(t, err, `--comm "carrier-pigeon" (want local, mpi or nccl)`)
	_, _, err = runCLI("run", "--comm", "nccl", "--steps", "1")
	require.ErrorIs(t, err, errNoCUDA)
}
