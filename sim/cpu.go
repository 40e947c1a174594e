package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/hugepage"
	"github.com/moex-project/moex/internal/memlimit"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// CPUProbe is what CalibrateCPU measured, per rank with all ranks running
// at once, as moex run's in-process ranks do.
type CPUProbe struct {
	Ranks int
	// ReadBW: bytes a second one rank reads (kernels.ReadBytes, its
	// GOMAXPROCS/ranks threads, its own 256 MiB/ranks buffer).
	ReadBW float64
	// MoEFLOPs: a DeepSeek-V2-Lite MoE layer's FLOPs a second (bf16
	// weights, 256 tokens: ~24 rows an expert, compute-bound), on
	// GOMAXPROCS/ranks workers as moex run gives each rank.
	MoEFLOPs float64
	// MLAFLOPs: dpattn.MLA's FLOPs a second (16 sequences × 1024 cached
	// bf16 rows, 16 heads of 576/512: compute-bound), FlashMLA's count.
	MLAFLOPs float64
	// AllGatherBW and AllGatherLatency: an in-process all-gather (ep's
	// local transport) of p bytes a rank takes AllGatherLatency +
	// (ranks−1)·p / AllGatherBW, from two sizes (8 B and 1 MiB).
	AllGatherBW, AllGatherLatency float64
}

// CalibrateCPU measures this machine for ranks in-process ranks and
// returns the cpu hardware preset: rates per rank, measured with every
// rank running at once (the ranks share the cores and the memory bus).
func CalibrateCPU(ranks int) (Hardware, error) {
	p, err := ProbeCPU(context.Background(), ranks)
	if err != nil {
		return Hardware{}, err
	}
	return p.Hardware(), nil
}

// Hardware is the cpu preset of a probe.
func (p CPUProbe) Hardware() Hardware {
	return Hardware{Name: "cpu", Mem: float64(memlimit.Machine()), MemFraction: 0.8, MemBW: p.ReadBW,
		GEMM: map[string]float64{"bf16": p.MoEFLOPs}, MLA: p.MLAFLOPs,
		IntraBW: p.AllGatherBW, IntraLatency: p.AllGatherLatency, InterBW: p.AllGatherBW, InterLatency: p.AllGatherLatency,
		RanksPerNode: p.Ranks, Shared: true,
		Sources: []string{fmt.Sprintf("measured on this machine, %d in-process ranks running at once, each: read %.1f GB/s, "+
			"MoE layer %.1f GFLOP/s, MLA %.1f GFLOP/s, all-gather %.2f GB/s + %.1f µs", p.Ranks, p.ReadBW/1e9, p.MoEFLOPs/1e9,
			p.MLAFLOPs/1e9, p.AllGatherBW/1e9, p.AllGatherLatency*1e6),
			"memory: the machine's, 80 % for weights and cache"}}
}

// ProbeCPU runs the probes; each runs on every rank at once, best of
// three passes.
func ProbeCPU(ctx context.Context, ranks int) (CPUProbe, error) {
	if ranks < 1 {
		return CPUProbe{}, fmt.Errorf("sim: cpu probe of %d ranks: at least one", ranks)
	}
	p := CPUProbe{Ranks: ranks}
	workers := max(1, runtime.GOMAXPROCS(0)/ranks)
	var err error
	if p.ReadBW, err = probeRead(ctx, ranks, workers); err != nil {
		return p, err
	}
	if p.MoEFLOPs, err = probeMoE(ctx, ranks, workers); err != nil {
		return p, err
	}
	if p.MLAFLOPs, err = probeMLA(ctx, ranks); err != nil {
		return p, err
	}
	if ranks > 1 {
		if p.AllGatherBW, p.AllGatherLatency, err = probeAllGather(ctx, ranks); err != nil {
			return p, err
		}
	} else {
		p.AllGatherBW, p.AllGatherLatency = p.ReadBW, 0 // no collective: never used
	}
	return p, nil
}

// atOnce runs f on every rank at once, passes times, and returns the
// best pass's seconds (the slowest rank's).
func atOnce(ctx context.Context, ranks, passes int, f func(rank int) error) (float64, error) {
	best := 0.0
	for pass := range passes {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		errs := make([]error, ranks)
		var wg sync.WaitGroup
		start := time.Now()
		for r := range ranks {
			wg.Go(func() { errs[r] = f(r) })
		}
		wg.Wait()
		s := time.Since(start).Seconds()
		for _, err := range errs {
			if err != nil {
				return 0, err
			}
		}
		if pass == 0 || s < best {
			best = s
		}
	}
	return best, nil
}

func probeRead(ctx context.Context, ranks, workers int) (float64, error) {
	const total = 256 << 20
	per := total / ranks / workers
	bufs := make([][]byte, ranks*workers)
	for i := range bufs {
		bufs[i] = make([]byte, per)
		hugepage.Advise(bufs[i])
		for j := 0; j < per; j += 4096 {
			bufs[i][j] = 0 // fault the pages in
		}
	}
	s, err := atOnce(ctx, ranks, 3, func(r int) error {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() { kernels.ReadBytes(bufs[r*workers+w]) })
		}
		wg.Wait()
		return nil
	})
	return float64(per*workers) / s, err
}

func probeMoE(ctx context.Context, ranks, workers int) (float64, error) {
	cfg := moe.DeepSeekV2Lite()
	layer, err := moe.NewRandom(cfg, kernels.BF16, 1)
	if err != nil {
		return 0, err
	}
	defer layer.Close()
	const tokens = 256
	rng := rand.New(rand.NewPCG(1, 2))
	xs, ys := make([][]float32, ranks), make([][]float32, ranks)
	shards := make([]*moe.Layer, ranks)
	place, err := ep.Contiguous(cfg.NumExperts, 1)
	if err != nil {
		return 0, err
	}
	for r := range ranks {
		xs[r], ys[r] = make([]float32, tokens*cfg.Hidden), make([]float32, tokens*cfg.Hidden)
		for i := range xs[r] {
			xs[r][i] = float32(rng.NormFloat64())
		}
		shards[r] = ep.Shard(layer, place, 0, workers)
	}
	if err := shards[0].Forward(ctx, xs[0], ys[0]); err != nil { // warm: pages, packing
		return 0, err
	}
	s, err := atOnce(ctx, ranks, 3, func(r int) error { return shards[r].Forward(ctx, xs[r], ys[r]) })
	flops := 2 * float64(tokens) * 3 * float64(cfg.Hidden) * float64(cfg.TopK*cfg.Inter+cfg.SharedInter)
	return flops / s, err
}

func probeMLA(ctx context.Context, ranks int) (float64, error) {
	const seqs, rows, heads, dim, dv = 16, 1024, 16, 576, 512
	rng := rand.New(rand.NewPCG(3, 4))
	caches := make([]*dpattn.LatentCache, ranks)
	qs, outs := make([][]float32, ranks), make([][]float32, ranks)
	queries := make([][]dpattn.Query, ranks)
	for r := range ranks {
		c, err := dpattn.NewLatentCache(seqs*rows/dpattn.DefaultBlockSize, dpattn.DefaultBlockSize, dim, kernels.BF16)
		if err != nil {
			return 0, err
		}
		data := make([]float32, rows*dim)
		for s := range seqs {
			for i := range data {
				data[i] = float32(rng.NormFloat64())
			}
			if err := c.Append(s, data); err != nil {
				return 0, err
			}
			queries[r] = append(queries[r], dpattn.Query{Table: c.BlockTable(s), Len: rows})
		}
		caches[r] = c
		qs[r] = make([]float32, seqs*heads*dim)
		for i := range qs[r] {
			qs[r][i] = float32(rng.NormFloat64())
		}
		outs[r] = make([]float32, seqs*heads*dv)
	}
	run := func(r int) error {
		return dpattn.MLA(ctx, caches[r], qs[r], queries[r], heads, dv, 0.04, outs[r], nil, dpattn.Options{})
	}
	if err := run(0); err != nil {
		return 0, err
	}
	s, err := atOnce(ctx, ranks, 3, run)
	return 2 * seqs * rows * heads * (dim + dv) / s, err
}

func probeAllGather(ctx context.Context, ranks int) (bw, latency float64, err error) {
	comms, err := ep.NewLocal(ranks)
	if err != nil {
		return 0, 0, err
	}
	timeOf := func(size, reps int) (float64, error) {
		payload := make([][]byte, ranks)
		for r := range payload {
			payload[r] = make([]byte, size)
		}
		s, err := atOnce(ctx, ranks, 3, func(r int) error {
			for range reps {
				if _, err := comms[r].AllGather(ctx, payload[r]); err != nil {
					return err
				}
			}
			return nil
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
	return float64((ranks-1)*big) / max(large-small, 1e-9), small, nil
}
