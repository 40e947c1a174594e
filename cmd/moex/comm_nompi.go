//go:build !mpi

package main

import (
	"errors"

	"github.com/moex-project/moex/ep"
)

// mpiWorld is the MPI transport, missing from this build.
func mpiWorld() (ep.Comm, func(), error) {
	return nil, nil, errors.New("this moex was built without MPI: build it with `make mpi` (needs libopenmpi-dev) and run it under mpirun")
}
