//go:build cuda || cudaemu

package main

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/dpattn/dpattngpu"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/decoderun"
	"github.com/moex-project/moex/moe"
	"github.com/moex-project/moex/moe/moegpu"
)

// moeOnDevice runs exec moe's layer on the device (one rank).
func moeOnDevice(j *epJob) (*epResult, error) {
	l, x, r, err := j.loadOne()
	if err != nil {
		return nil, err
	}
	defer l.Close()
	g, closeAll, err := layerOnDevice(l)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	return r, g.ForwardRouting(context.Background(), x.Data, r.y, r.ids, r.weights)
}

// layerOnDevice opens the device and uploads the layer; the function
// returned frees both.
func layerOnDevice(l *moe.Layer) (*moegpu.MoE, func(), error) {
	d, closeDev, err := openDevice()
	if err != nil {
		return nil, nil, err
	}
	g, err := moegpu.NewMoE(d, l)
	if err != nil {
		closeDev()
		return nil, nil, err
	}
	return g, func() { g.Close(); closeDev() }, nil
}

// mlaOnDevice runs exec mla-decode's batch on the device.
func mlaOnDevice(m mlaJob) (out, lse []float32, err error) {
	d, closeDev, err := openDevice()
	if err != nil {
		return nil, nil, err
	}
	defer closeDev()
	split := m.split
	if split == 0 {
		split = attn.DefaultSplitRows
	}
	return dpattngpu.MLADecode(d, dpattngpu.MLAInput{Q: m.q, CacheF32: m.cache, BlockSize: m.blockSize, D: m.d,
		BlockTable: m.blockTable, MaxBlocks: m.maxBlocks, SeqLens: m.seqLens, Heads: m.heads, DV: m.dv,
		SplitRows: split, Scale: m.scale})
}

// openDeviceRun opens the device for moex run: every rank's expert shard
// resident on it, or in gather mode its whole MoE stage (the hidden states
// gathered and scattered in device memory over deviceComm), and its
// attention over a synced copy of its cache (the ranks of a process share
// the device), with CUDA graphs when graphs is set.
func openDeviceRun(graphs bool) (*deviceRun, error) {
	d, closeDev, err := openDevice()
	if err != nil {
		return nil, err
	}
	att := dpattngpu.NewAttention(d)
	if graphs {
		att.EnableGraphs()
	}
	return &deviceRun{
		experts: func(_ int, shard *moe.Layer) (decoderun.ExpertRunner, error) {
			ex, err := moegpu.NewExperts(d, shard)
			if err != nil {
				return nil, err
			}
			if graphs {
				ex.EnableGraphs()
			}
			return ex, nil
		},
		gather: func(ctx context.Context, _ int, shard *moe.Layer, comm ep.Comm) (decoderun.GatherRunner, error) {
			g, err := dpattngpu.NewGatherMoE(d, shard, deviceComm(d, comm))
			if err != nil {
				return nil, err
			}
			if graphs {
				g.EnableGraphs()
			}
			return g, nil
		},
		layer: func(ctx context.Context, _ int, a attn.Block, shard *moe.Layer, comm ep.Comm) (decoderun.LayerRunner, error) {
			blk, ok := a.(*attn.MLABlock)
			if _, gate := shard.SharedExpert(); !ok || gate != nil {
				return nil, nil // the stages apart: qwen2_moe's shared gate runs on the host
			}
			l, err := dpattngpu.NewDecodeLayer(att, blk, shard, deviceComm(d, comm))
			if err != nil {
				return nil, err
			}
			if graphs {
				l.EnableGraphs()
			}
			return l, nil
		},
		core:  att,
		proj:  att.Projections(),
		close: func() { att.Close(); closeDev() },
	}, nil
}

// benchMoEOnDevice times the layer on the device for each token count:
// eager launches (MoE.Forward, layout read back to size the GEMMs) and the
// fixed-buffer step replayed from its CUDA graph, host copies included.
func benchMoEOnDevice(l *moe.Layer, name string, ts []int, o *benchOpts, seed uint64) ([]benchResult, error) {
	g, closeAll, err := layerOnDevice(l)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	c := l.Config
	rng := rand.New(rand.NewPCG(seed, 7))
	var results []benchResult
	for _, T := range ts {
		x, y, ids := moeCase(rng, c, T)
		if err := g.ForwardRouting(context.Background(), x, y, ids, nil); err != nil {
			return nil, err
		}
		bytes := l.WeightBytesRead(ids) + int64(len(x)+len(y))*4
		label := fmt.Sprintf("%s T=%d", name, T)
		times, err := o.time(label+" cuda", func() error { return g.Forward(context.Background(), x, y) })
		if err != nil {
			return nil, err
		}
		results = append(results, makeResult("moe", label, "cuda", "bf16", 0, times, c.FLOPs(T), bytes, 0))
		step, err := g.NewStep(T)
		if err != nil {
			return nil, err
		}
		if err := step.Capture(); err != nil {
			step.Close()
			return nil, err
		}
		times, err = o.time(label+" cuda-graph", func() error { return step.Forward(context.Background(), x, y) })
		step.Close()
		if err != nil {
			return nil, err
		}
		results = append(results, makeResult("moe", label, "cuda-graph", "bf16", 0, times, c.FLOPs(T), bytes, 0))
	}
	return results, nil
}
