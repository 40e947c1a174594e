//go:build cuda || cudaemu

package main

import (
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/moe"
)

// moeOnDevice runs exec moe's layer on the device (one rank).
func moeOnDevice(j *epJob) (*epResult, error) {
	l, err := moe.Load(j.model, j.layer)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	c := l.Config
	x, err := j.readInput(c)
	if err != nil {
		return nil, err
	}
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
	T := x.Shape[0]
	r := &epResult{tokens: T, hidden: c.Hidden, topK: c.TopK, y: make([]float32, T*c.Hidden),
		ids: make([]int32, T*c.TopK), weights: make([]float32, T*c.TopK)}
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
