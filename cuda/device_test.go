//go:build cuda

package cuda_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/cuda/cudatest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

func TestRoutingKernels(t *testing.T) {
	d := cudatest.Open(t)
	cfg := &moe.Config{ModelType: "deepseek_v3", Hidden: 1, NumExperts: 256, TopK: 8, Inter: 1, Scoring: moe.Sigmoid,
		Method: moe.NoAuxTC, NumGroups: 8, TopKGroups: 4, NormTopK: true, RoutedScaling: 2.5}
	const T = 33
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, T*cfg.NumExperts)
	wide := make([]float64, len(logits))
	for i := range logits {
		logits[i] = float32(rng.NormFloat64())
		wide[i] = float64(logits[i])
	}
	bias := make([]float32, cfg.NumExperts)
	for i := range bias {
		bias[i] = float32(rng.NormFloat64() * 0.05)
	}
	w, _ := kernels.NewF32(cfg.NumExperts, 1, make([]float32, cfg.NumExperts))
	router, err := moe.NewRouter(cfg, w, bias)
	require.NoError(t, err)
	wantIDs := make([]int32, T*cfg.TopK)
	wantW := make([]float32, T*cfg.TopK)
	router.RouteLogits(wide, wantIDs, wantW)

	ids := cudatest.Up(t, d, make([]int32, T*cfg.TopK))
	weights := cudatest.Up(t, d, make([]float32, T*cfg.TopK))
	require.NoError(t, d.Gate(cfg.GateKernelArgs(), cudatest.Up(t, d, logits), cudatest.Up(t, d, bias), ids, weights, T))
	gotIDs := make([]int32, T*cfg.TopK)
	gotW := make([]float32, T*cfg.TopK)
	require.NoError(t, cuda.Download(d, ids, gotIDs))
	require.NoError(t, cuda.Download(d, weights, gotW))
	require.Equal(t, wantIDs, gotIDs)
	for i := range gotW {
		require.InDelta(t, wantW[i], gotW[i], 1e-5*math.Max(1, math.Abs(float64(wantW[i]))))
	}

	lay, err := kernels.NewLayout(wantIDs, T, cfg.TopK, cfg.NumExperts, 64)
	require.NoError(t, err)
	n := T * cfg.TopK
	counts, offsets := cudatest.Up(t, d, make([]int32, cfg.NumExperts)), cudatest.Up(t, d, make([]int32, cfg.NumExperts+1))
	sorted := cudatest.Up(t, d, make([]int32, n+cfg.NumExperts*63))
	blockExpert := cudatest.Up(t, d, make([]int32, (n+cfg.NumExperts*63)/64+1))
	rows := cudatest.Up(t, d, make([]int32, n))
	require.NoError(t, d.Align(cuda.AlignArgs{IDs: ids, N: n, Lo: 0, Experts: cfg.NumExperts, Block: 64, MaxBlocks: (n+cfg.NumExperts*63)/64 + 1, Counts: counts, Offsets: offsets, Sorted: sorted, BlockExpert: blockExpert, Rows: rows}))
	gotOff := make([]int32, cfg.NumExperts+1)
	require.NoError(t, cuda.Download(d, offsets, gotOff))
	require.Equal(t, lay.Offsets, gotOff)
	gotRows := make([]int32, n)
	require.NoError(t, cuda.Download(d, rows, gotRows))
	require.Equal(t, lay.Rows, gotRows)
}

func TestPrepKernelsOnGPU(t *testing.T) { testPrepKernels(t, cudatest.Open(t)) }
