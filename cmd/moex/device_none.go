//go:build !cuda && !cudaemu

package main

import (
	"context"
	"errors"

	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/moe"
)

// errNoCUDA is what --backend cuda says in a build without the GPU path.
var errNoCUDA = errors.New("this moex was built without CUDA: build it with `make cuda` (needs nvcc; runs where a GPU and its driver are)")

const deviceName = "no device"

func moeOnDevice(*epJob) (*epResult, error) { return nil, errNoCUDA }

func mlaOnDevice(mlaJob) (out, lse []float32, err error) { return nil, nil, errNoCUDA }

func benchMoEOnDevice(*moe.Layer, string, []int, *benchOpts, uint64) ([]benchResult, error) {
	return nil, errNoCUDA
}

func openDeviceRun(bool) (*deviceRun, error) { return nil, errNoCUDA }

func ncclWorld(context.Context) (ep.Comm, ep.Comm, func(), error) { return nil, nil, nil, errNoCUDA }
