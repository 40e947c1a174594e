//go:build !cuda && !cudaemu

package main

import "errors"

// errNoCUDA is what --backend cuda says in a build without the GPU path.
var errNoCUDA = errors.New("this moex was built without CUDA: build it with `make cuda` (needs nvcc; runs where a GPU and its driver are)")

func moeOnDevice(*epJob) (*epResult, error) { return nil, errNoCUDA }

func mlaOnDevice(mlaJob) (out, lse []float32, err error) { return nil, nil, errNoCUDA }
