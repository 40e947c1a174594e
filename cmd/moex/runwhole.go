package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/model"
)

// wholeRun is moex run --whole's settings.
type wholeRun struct {
	path                         string
	ranks, steps, batch, context int
	mode                         string
	seed                         uint64
	numerics                     kernels.Numerics
}

// runWhole runs a whole model over data-parallel attention ranks: each
// rank's batch requests of context random prompt tokens prefilled on its
// own caches in one step, then steps greedy decode steps, every rank in
// step with the others through the coordinator, the MoE layers shared in
// all-to-all or gather mode. Then rank 0's first request runs alone on one
// rank and its logits are compared with the group's: bit for bit in
// all-to-all mode, within 1e-6 in gather mode. It fails when they differ.
func runWhole(ctx context.Context, w wholeRun, stdout io.Writer) error {
	t0 := time.Now()
	m, err := model.Load(w.path)
	if err != nil {
		return err
	}
	defer m.Close()
	if w.numerics != kernels.Exact {
		if err := m.SetNumerics(w.numerics); err != nil {
			return fmt.Errorf("run: %w", err)
		}
	}
	dp, err := m.NewDP(w.ranks, w.mode)
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	const blockRows = 16
	perSeq := (w.context+w.steps+blockRows-1)/blockRows + 1
	kvs := make([]*model.KV, w.ranks)
	for r := range kvs {
		if kvs[r], err = m.NewKV(w.batch*perSeq, blockRows, kernels.BF16); err != nil {
			return fmt.Errorf("run: %w", err)
		}
	}
	setup := time.Since(t0)
	a := m.Arch
	fmt.Fprintf(stdout, "moex run --whole: %s (%s, %d layers, %v attention), %d ranks × %d requests of %d prompt tokens, %d decode steps, MoE mode %s\n",
		w.path, a.Name, m.NumLayers(), a.Attention.Kind, w.ranks, w.batch, w.context, w.steps, w.mode)
	rng := rand.New(rand.NewPCG(w.seed, 0x7e))
	prompts := make([][][]int32, w.ranks) // [rank][request] prompt
	for r := range prompts {
		for range w.batch {
			p := make([]int32, w.context)
			for i := range p {
				p[i] = int32(rng.IntN(m.Vocab))
			}
			prompts[r] = append(prompts[r], p)
		}
	}
	// step runs one step on every rank: rank r's (seqs, ids, rows).
	type call struct {
		seqs []int
		ids  []int32
		rows []int
	}
	step := func(calls []call) ([][]float32, error) {
		out := make([][]float32, w.ranks)
		errs := make([]error, w.ranks)
		var wg sync.WaitGroup
		for r := range w.ranks {
			wg.Go(func() { out[r], errs[r] = dp.Forward(ctx, r, kvs[r], calls[r].seqs, calls[r].ids, calls[r].rows) })
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				return nil, fmt.Errorf("run: rank %d: %w", r, err)
			}
		}
		return out, nil
	}
	V := m.Vocab
	// Prefill: every request's prompt, its last row's logits.
	calls := make([]call, w.ranks)
	for r := range calls {
		for s, p := range prompts[r] {
			for range p {
				calls[r].seqs = append(calls[r].seqs, s)
			}
			calls[r].ids = append(calls[r].ids, p...)
			calls[r].rows = append(calls[r].rows, (s+1)*w.context-1)
		}
	}
	tp := time.Now()
	logits, err := step(calls)
	if err != nil {
		return err
	}
	prefill := time.Since(tp)
	group := [][]float32{logits[0][:V]} // rank 0's request 0, every step
	tokens := [][]int32{{}}             // its generated tokens
	next := make([][]int32, w.ranks)
	for r := range next {
		for s := range w.batch {
			next[r] = append(next[r], argmax(logits[r][s*V:(s+1)*V]))
		}
	}
	td := time.Now()
	for range w.steps {
		for r := range calls {
			calls[r] = call{ids: next[r]}
			for s := range w.batch {
				calls[r].seqs = append(calls[r].seqs, s)
			}
		}
		tokens[0] = append(tokens[0], next[0][0])
		if logits, err = step(calls); err != nil {
			return err
		}
		group = append(group, logits[0][:V])
		for r := range next {
			next[r] = nil
			for s := range w.batch {
				next[r] = append(next[r], argmax(logits[r][s*V:(s+1)*V]))
			}
		}
	}
	decode := time.Since(td)
	// Rank 0's first request alone.
	kv, err := m.NewKV(perSeq, blockRows, kernels.BF16)
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	p := prompts[0][0]
	alone, err := m.Forward(ctx, kv, make([]int, len(p)), p, []int{len(p) - 1})
	if err != nil {
		return fmt.Errorf("run: one rank: %w", err)
	}
	worst, equal := 0.0, true
	compare := func(got, want []float32) {
		var num, den float64
		for i := range want {
			equal = equal && got[i] == want[i]
			d := float64(got[i] - want[i])
			num += d * d
			den += float64(want[i]) * float64(want[i])
		}
		worst = math.Max(worst, math.Sqrt(num/den))
	}
	compare(group[0], alone)
	for i, id := range tokens[0] {
		if alone, err = m.Forward(ctx, kv, []int{0}, []int32{id}, nil); err != nil {
			return fmt.Errorf("run: one rank: %w", err)
		}
		compare(group[i+1], alone)
	}
	n := w.ranks * w.batch
	fmt.Fprintf(stdout, "  prefill: %d tokens in %v (%.1f tokens/s); decode: %d tokens in %v (%.1f tokens/s); setup %v\n",
		n*w.context, prefill.Round(time.Millisecond), float64(n*w.context)/prefill.Seconds(),
		n*w.steps, decode.Round(time.Millisecond), float64(n*w.steps)/decode.Seconds(), setup.Round(time.Millisecond))
	fmt.Fprintf(stdout, "  KV cache: %d B a token over %d layers (bf16), %.1f MiB a rank at the run's end\n",
		m.KVBytesPerToken(kernels.BF16), m.NumLayers(), float64(m.KVBytesPerToken(kernels.BF16))*float64(w.batch*(w.context+w.steps))/(1<<20))
	want := "bit-identical"
	ok := equal
	if w.mode == "gather" {
		want, ok = "within 1e-6", worst <= 1e-6
	}
	fmt.Fprintf(stdout, "  parity against one rank (%s expected): bit-identical %v, relative error %.2e: %s\n", want, equal, worst, map[bool]string{true: "ok", false: "FAILED"}[ok])
	if !ok {
		return fmt.Errorf("run: the ranks' logits differ from one rank's (relative error %.2e)", worst)
	}
	return nil
}
