//go:build cuda || cudaemu

package main

import (
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/moe"
)

// moeOnDevice runs exec moe's layer on the device (one rank).
func moeOnDevice(j *epJob) (*epResult, error) {
	l, x, r, err := j.loadOne()
	if err != nil {
		return nil, err
	}
	defer l.Close()
	d, closeDev, err := openDevice()
	if err != nil {
		return nil, err
	}
	defer closeDev()
	g, err := cuda.NewMoE(d, l)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	return r, g.ForwardRouting(x.Data, r.y, r.ids, r.weights)
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
		split = 512 // dpattn's default
	}
	return cuda.MLADecode(d, cuda.MLAInput{Q: m.q, CacheF32: m.cache, BlockSize: m.blockSize, D: m.d,
		BlockTable: m.blockTable, MaxBlocks: m.maxBlocks, SeqLens: m.seqLens, Heads: m.heads, DV: m.dv,
		SplitRows: split, Scale: m.scale})
}

// deviceExperts opens the device for moex run: every rank's expert shard
// resident on it (the ranks share it), and what closes it.
func deviceExperts() (func(int, *moe.Layer) (moe.ExpertRunner, func(), error), func(), error) {
	d, closeDev, err := openDevice()
	if err != nil {
		return nil, nil, err
	}
	return func(_ int, shard *moe.Layer) (moe.ExpertRunner, func(), error) {
		ex, err := cuda.NewExperts(d, shard)
		if err != nil {
			return nil, nil, err
		}
		return ex, ex.Close, nil
	}, closeDev, nil
}
