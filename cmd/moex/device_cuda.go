//go:build cuda

package main

import "github.com/moex-project/moex/cuda"

// deviceName says where --backend cuda runs.
const deviceName = "GPU 0"

// openDevice opens GPU 0 for --backend cuda.
func openDevice() (cuda.Launcher, func(), error) {
	d, err := cuda.Open(0)
	if err != nil {
		return nil, nil, err
	}
	return d, func() { d.Close() }, nil
}
