package moe_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"

	"github.com/moex-project/moex/internal/npy"
	"github.com/moex-project/moex/moe"
)

// Load a layer's MoE block from a Hugging Face checkpoint and run it on a
// batch; the outputs match the float64 reference stored beside the
// checkpoint (x.npy in, y.npy and ids.npy out).
func ExampleLoad() {
	dir := filepath.Join("..", "testdata", "moe", "deepseek_v3_f32")
	layer, err := moe.Load(dir, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer layer.Close()

	x, err := npy.ReadFloat32(filepath.Join(dir, "x.npy")) // [tokens, hidden]
	if err != nil {
		fmt.Println(err)
		return
	}
	tokens, hidden, k := x.Shape[0], x.Shape[1], layer.Config.TopK
	y := make([]float32, tokens*hidden)
	ids := make([]int32, tokens*k) // each token's experts, ascending
	if err := layer.ForwardRouting(context.Background(), x.Data, y, ids, nil); err != nil {
		fmt.Println(err)
		return
	}

	wantY, _ := npy.ReadFloat32(filepath.Join(dir, "y.npy"))
	wantIDs, _ := npy.ReadInt32(filepath.Join(dir, "ids.npy"))
	var diff, norm float64
	for i, v := range wantY.Data {
		diff += math.Pow(float64(y[i]-v), 2)
		norm += math.Pow(float64(v), 2)
	}
	fmt.Printf("%d tokens of %d, top-%d of %d experts\n", tokens, hidden, k, layer.Config.NumExperts)
	fmt.Println("experts as the reference routes them:", slices.Equal(ids, wantIDs.Data))
	fmt.Println("output within 1e-5 of the reference:", math.Sqrt(diff/norm) <= 1e-5)
	// Output:
	// 16 tokens of 32, top-4 of 16 experts
	// experts as the reference routes them: true
	// output within 1e-5 of the reference: true
}

// A bad input is an error of a class a caller can branch on, whose message
// names the problem.
func ExampleErrNonFinite() {
	dir := filepath.Join("..", "testdata", "moe", "deepseek_v3_f32")
	layer, err := moe.Load(dir, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer layer.Close()
	H := layer.Config.Hidden
	x := make([]float32, 2*H)
	x[H+3] = float32(math.NaN())
	err = layer.Forward(context.Background(), x, make([]float32, len(x)))
	fmt.Println(err)
	fmt.Println(errors.Is(err, moe.ErrNonFinite))
	// Output:
	// moe: input token 1 has a non-finite value NaN at column 3
	// true
}
