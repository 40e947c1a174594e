//go:build cudaemu && !cuda

package moegpu_test

import (
	"context"
	"fmt"
	"math"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
	"github.com/moex-project/moex/moe/moegpu"
)

// A MoE layer on a device (here the CPU emulation of the CUDA kernels; a
// GPU with cuda.Open(0) in a `cuda` build): the weights uploaded once as
// bf16, each Forward routing, grouping, running and combining on the
// device, within the bf16 tolerance of the fp32 CPU layer.
func ExampleNewMoE() {
	cfg := &moe.Config{ModelType: "mixtral", Hidden: 64, NumExperts: 8, TopK: 2, Inter: 32, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	layer, err := moe.NewRandom(cfg, kernels.BF16, 7)
	if err != nil {
		fmt.Println(err)
		return
	}
	dev, err := moegpu.NewMoE(cuda.NewEmu(), layer)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()

	ctx := context.Background()
	x := moetest.Input(1, 4, cfg.Hidden, false) // [tokens, hidden]
	got, want := make([]float32, len(x)), make([]float32, len(x))
	if err := dev.Forward(ctx, x, got); err != nil {
		fmt.Println(err)
		return
	}
	if err := layer.Forward(ctx, x, want); err != nil {
		fmt.Println(err)
		return
	}
	var diff, norm float64
	for i := range want {
		diff += math.Pow(float64(got[i]-want[i]), 2)
		norm += math.Pow(float64(want[i]), 2)
	}
	fmt.Println("within 1e-2 of the CPU layer:", math.Sqrt(diff/norm) <= 1e-2)
	// Output: within 1e-2 of the CPU layer: true
}
