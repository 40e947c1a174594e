package ep_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/npy"
	"github.com/moex-project/moex/moe"
)

// Expert parallelism over four in-process ranks: each rank maps only its
// experts, routes its own slice of the tokens, and the outputs are the
// bits one rank computes.
func ExampleLoad() {
	dir := filepath.Join("..", "testdata", "moe", "deepseek_v3_f32")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a rank that never arrives fails by then
	defer cancel()
	x, err := npy.ReadFloat32(filepath.Join(dir, "x.npy")) // [tokens, hidden]
	if err != nil {
		fmt.Println(err)
		return
	}
	tokens, H := x.Shape[0], x.Shape[1]

	const ranks = 4
	place, err := ep.Contiguous(16, ranks) // the checkpoint's 16 experts, 4 a rank
	if err != nil {
		fmt.Println(err)
		return
	}
	split := ep.Split(tokens, ranks) // rank r owns tokens split[r] … split[r+1]-1
	y := make([]float32, tokens*H)
	errs, err := ep.RunLocal(ranks, func(c ep.Comm) error {
		l, err := ep.Load(dir, 0, c, place)
		if err != nil {
			return err
		}
		defer l.Close()
		lo, hi := split[c.Rank()]*H, split[c.Rank()+1]*H
		return l.Forward(ctx, x.Data[lo:hi], y[lo:hi])
	})
	if err := errorsJoin(err, errs); err != nil {
		fmt.Println(err)
		return
	}

	one, err := moe.Load(dir, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer one.Close()
	want := make([]float32, len(y))
	if err := one.Forward(ctx, x.Data, want); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("experts of rank 1:", place.Local(1))
	fmt.Println("4 ranks give the bits of one:", slices.Equal(y, want))
	// Output:
	// experts of rank 1: [4 5 6 7]
	// 4 ranks give the bits of one: true
}

func errorsJoin(err error, errs []error) error {
	if err != nil {
		return err
	}
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
