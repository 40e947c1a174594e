package dpattn_test

import (
	"context"
	"fmt"
	"time"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/kernels"
)

// One step of DP attention's coordinator over three ranks: rank 1 has no
// request this step, so it runs an IDLE batch of zero tokens and still
// joins the collectives; every rank decodes or idles, so the step may
// replay a captured graph.
func ExampleCoordinator_Plan() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	batch := []int{2, 0, 3} // each rank's decode batch this step
	plans := make([]*dpattn.StepPlan, len(batch))
	errs, err := ep.RunLocal(len(batch), func(c ep.Comm) error {
		p, err := dpattn.NewCoordinator(c).Plan(ctx, batch[c.Rank()], dpattn.Decode)
		plans[c.Rank()] = p
		return err
	})
	for _, e := range append(errs, err) {
		if e != nil {
			fmt.Println(e)
			return
		}
	}
	for r, p := range plans {
		fmt.Printf("rank %d: tokens %d from %d of %v, idle %v, graph %v\n", r, p.Tokens, p.Offset, p.Counts, p.Idle, p.GraphOK)
	}
	// Output:
	// rank 0: tokens 2 from 0 of [2 0 3], idle false, graph true
	// rank 1: tokens 0 from 2 of [2 0 3], idle true, graph true
	// rank 2: tokens 3 from 2 of [2 0 3], idle false, graph true
}

// MLA decode over a paged latent cache: one sequence of three cached rows
// (latent dims 4, of which the first 2 are the values). A zero query
// weighs every row alike, so the output is the mean of the values and the
// log-sum-exp is ln 3.
func ExampleMLA() {
	cache, err := attn.NewCache(4, 2, 4, kernels.F32) // 4 blocks of 2 rows of 4 values
	if err != nil {
		fmt.Println(err)
		return
	}
	const seq = 7
	if err := cache.Append(seq, []float32{1, 2, 0, 0, 3, 4, 0, 0, 5, 6, 0, 0}); err != nil {
		fmt.Println(err)
		return
	}
	q := make([]float32, 1*1*4) // [queries, heads, dim]
	out, lse := make([]float32, 2), make([]float32, 1)
	queries := []attn.Query{{Table: cache.BlockTable(seq), Len: cache.Len(seq)}}
	if err := attn.MLA(context.Background(), cache, q, queries, attn.MLAParams{Heads: 1, ValueDim: 2, Scale: 0.5}, out, lse); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("out %.4f, lse %.4f\n", out, lse[0])
	// Output:
	// out [3.0000 4.0000], lse 1.0986
}
