package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/memlimit"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// CPUProbe is what ProbeCPU measured on this machine, each probe on all of
// its cores at once (GOMAXPROCS workers), with moex's own kernels at
// DeepSeek-V2-Lite's shapes: the rates `moex bench moe` and `moex bench
// mla` report.
type CPUProbe struct {
	// StreamBW: the bytes a second the MoE layer's decode reads: a
	// DeepSeek-V2-Lite MoE layer (bf16) at 8 tokens, the bytes of the
	// experts the routing chose and of the shared expert over the time.
	// It is what a memory-bound stage reaches here (weights streamed
	// through the grouped GEMM), below the bare read bandwidth.
	StreamBW float64
	// GEMM: the same layer's FLOPs a second at 256 tokens (~24 rows an
	// expert: compute-bound).
	GEMM float64
	// MLA and MLARow: attn.MLA over 16 sequences × 1024 cached bf16 rows
	// takes rows·MLARow + FLOPs/MLA (FlashMLA's FLOP count), solved from
	// its times at 4 and 16 heads of 576/512.
	MLA, MLARow float64
	// Router: kernels.RouterLogits's FLOPs a second over DeepSeek-V2-Lite's
	// router (64 experts × 2048, fp32), 16 tokens a call (moe's chunk) on
	// every thread at once.
	Router float64
	// AllGatherBW and AllGatherLatency: an all-gather over two in-process
	// ranks (ep's local transport) of p bytes a rank takes
	// AllGatherLatency + p / AllGatherBW, from 8 B and 1 MiB.
	AllGatherBW, AllGatherLatency float64
}

// CalibrateCPU measures this machine and returns its cpu preset for ranks
// in-process ranks.
func CalibrateCPU(ranks int) (Hardware, error) {
	p, err := ProbeCPU(context.Background())
	if err != nil {
		return Hardware{}, err
	}
	return p.Hardware(ranks), nil
}

// Hardware is the cpu preset of a probe for ranks in-process ranks: they
// run at once on the machine's cores (Shared), so a rank's stage takes its
// work over the machine's rate divided by the ranks, the way the ranks of
// moex run share the machine.
func (p CPUProbe) Hardware(ranks int) Hardware {
	ranks = max(ranks, 1)
	n := float64(ranks)
	return Hardware{Name: "cpu", Mem: float64(memlimit.Machine()) / n, MemFraction: 0.8, MemBW: p.StreamBW / n,
		GEMM: map[string]float64{"bf16": p.GEMM / n}, MLA: p.MLA / n, MLARow: p.MLARow * n, Router: p.Router / n,
		IntraBW: p.AllGatherBW, IntraLatency: p.AllGatherLatency, InterBW: p.AllGatherBW, InterLatency: p.AllGatherLatency,
		RanksPerNode: ranks, Shared: true,
		Sources: []string{fmt.Sprintf("measured on this machine (%d threads): MoE decode streams %.1f GB/s of weights, "+
			"MoE at 256 tokens %.1f GFLOP/s, MLA %.1f GFLOP/s + %.0f ns a cached row, router %.1f GFLOP/s, in-process all-gather "+
			"%.2f GB/s + %.1f µs; each of %d ranks has 1/%d of the rates", runtime.GOMAXPROCS(0), p.StreamBW/1e9, p.GEMM/1e9, p.MLA/1e9,
			p.MLARow*1e9, p.Router/1e9, p.AllGatherBW/1e9, p.AllGatherLatency*1e6, ranks, ranks),
			"memory: the machine's, shared by the ranks, 80 % for weights and cache"}}
}

// ProbeCPU runs the probes, best of three passes each.
func ProbeCPU(ctx context.Context) (CPUProbe, error) {
	var p CPUProbe
	var err error
	runtime.GC() // no collection of the caller's garbage inside a probe
	if p.MLA, p.MLARow, err = probeMLA(ctx); err != nil {
		return p, err
	}
	if p.AllGatherBW, p.AllGatherLatency, err = probeAllGather(ctx); err != nil {
		return p, err
	}
	if p.Router, err = probeRouter(ctx); err != nil {
		return p, err
	}
	if p.StreamBW, p.GEMM, err = probeMoE(ctx); err != nil {
		return p, err
	}
	return p, nil
}

// best is the shortest of passes runs of f, in seconds.
func best(ctx context.Context, passes int, f func() error) (float64, error) {
	t := 0.0
	for pass := range passes {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		start := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		if s := time.Since(start).Seconds(); pass == 0 || s < t {
			t = s
		}
	}
	return t, nil
}

// probeMoE times a random DeepSeek-V2-Lite MoE layer (bf16) at 8 tokens
// (bytes of the chosen experts and the shared one a second) and at 256
// (FLOPs a second).
func probeMoE(ctx context.Context) (streamBW, gemm float64, err error) {
	cfg := moe.DeepSeekV2Lite()
	layer, err := moe.NewRandom(cfg, kernels.BF16, 1)
	if err != nil {
		return 0, 0, err
	}
	defer layer.Close()
	H, k := cfg.Hidden, cfg.TopK
	rng := rand.New(rand.NewPCG(1, 2))
	input := func(tokens int) ([]float32, []float32) {
		x := make([]float32, tokens*H)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x, make([]float32, len(x))
	}
	perExpert := 3 * float64(H) * float64(cfg.Inter) * 2
	shared := 3 * float64(H) * float64(cfg.SharedInter) * 2
	x, y := input(256)
	if err := layer.Forward(ctx, x, y); err != nil { // warm: pages, packing
		return 0, 0, err
	}
	s, err := best(ctx, 3, func() error { return layer.Forward(ctx, x, y) })
	if err != nil {
		return 0, 0, err
	}
	gemm = 2 * 256 * (float64(k)*perExpert + shared) / 2 / s // bytes/2: a weight's two FLOPs a token
	x, y = input(8)
	ids := make([]int32, 8*k)
	if err := layer.ForwardRouting(ctx, x, y, ids, nil); err != nil {
		return 0, 0, err
	}
	slices.Sort(ids)
	chosen := len(slices.Compact(ids))
	s, err = best(ctx, 5, func() error { return layer.Forward(ctx, x, y) })
	return (float64(chosen)*perExpert + shared) / s, gemm, err
}

// probeMLA solves t(h) = rows·row + rows·h·2·(576+512)/rate from the
// times at 4 and 16 heads.
func probeMLA(ctx context.Context) (rate, row float64, err error) {
	const seqs, rows, dim, dv = 16, 1024, 576, 512
	const n, perHead = seqs * rows, 2 * (dim + dv)
	rng := rand.New(rand.NewPCG(3, 4))
	cache, err := attn.NewCache(n/attn.DefaultBlockSize, attn.DefaultBlockSize, dim, kernels.BF16)
	if err != nil {
		return 0, 0, err
	}
	data := make([]float32, rows*dim)
	var queries []attn.Query
	for s := range seqs {
		for i := range data {
			data[i] = float32(rng.NormFloat64())
		}
		if err := cache.Append(s, data); err != nil {
			return 0, 0, err
		}
		queries = append(queries, attn.Query{Table: cache.BlockTable(s), Len: rows})
	}
	// The two head counts alternate, five rounds after a warm one, and
	// each keeps its best: the machine's drift hits both alike.
	run := map[int]func() error{}
	for _, heads := range []int{4, 16} {
		q := make([]float32, seqs*heads*dim)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		out := make([]float32, seqs*heads*dv)
		run[heads] = func() error {
			return attn.MLA(ctx, cache, q, queries, attn.MLAParams{Heads: heads, ValueDim: dv, Scale: 0.04}, out, nil)
		}
	}
	t := map[int]float64{}
	for round := range 6 {
		for _, heads := range []int{4, 16} {
			s, err := best(ctx, 1, run[heads])
			if err != nil {
				return 0, 0, err
			}
			if round == 1 || round > 1 && s < t[heads] {
				t[heads] = s
			}
		}
	}
	rate = n * 12 * perHead / max(t[16]-t[4], 1e-9)
	return rate, max(t[4]/n-4*perHead/rate, 0), nil
}

// probeAllGather times all-gathers over two in-process ranks.
func probeAllGather(ctx context.Context) (bw, latency float64, err error) {
	comms, err := ep.NewLocal(2)
	if err != nil {
		return 0, 0, err
	}
	timeOf := func(size, reps int) (float64, error) {
		payload := make([]byte, size)
		s, err := best(ctx, 3, func() error {
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for r := range comms {
				wg.Go(func() {
					for range reps {
						if _, err := comms[r].AllGather(ctx, payload); err != nil {
							errs[r] = err
							return
						}
					}
				})
			}
			wg.Wait()
			return errors.Join(errs...)
		})
		return s / float64(reps), err
	}
	small, err := timeOf(8, 200)
	if err != nil {
		return 0, 0, err
	}
	const big = 1 << 20
	large, err := timeOf(big, 20)
	if err != nil {
		return 0, 0, err
	}
	return big / max(large-small, 1e-9), small, nil
}

// probeRouter times kernels.RouterLogits over DeepSeek-V2-Lite's router,
// 16 tokens a call, on every thread at once.
func probeRouter(ctx context.Context) (float64, error) {
	const experts, hidden, tokens = 64, 2048, 16
	rng := rand.New(rand.NewPCG(5, 6))
	wv := make([]float32, experts*hidden)
	for i := range wv {
		wv[i] = float32(rng.NormFloat64())
	}
	w, err := kernels.NewF32(experts, hidden, wv)
	if err != nil {
		return 0, err
	}
	threads := runtime.GOMAXPROCS(0)
	xs := make([][]float32, threads)
	dst := make([][]float64, threads)
	for i := range xs {
		xs[i] = make([]float32, tokens*hidden)
		for j := range xs[i] {
			xs[i][j] = float32(rng.NormFloat64())
		}
		dst[i] = make([]float64, tokens*experts)
	}
	const reps = 8
	s, err := best(ctx, 3, func() error {
		var wg sync.WaitGroup
		for i := range threads {
			wg.Go(func() {
				for range reps {
					kernels.RouterLogits(dst[i], xs[i], w)
				}
			})
		}
		wg.Wait()
		return nil
	})
	return float64(threads*reps) * 2 * tokens * experts * hidden / s, err
}
