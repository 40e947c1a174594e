//go:build mpi

package main

import (
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/ep/mpi"
)

// mpiWorld is MPI_COMM_WORLD; the returned function finalises MPI.
func mpiWorld() (ep.Comm, func(), error) {
	c, err := mpi.World()
	if err != nil {
		return nil, nil, err
	}
	return c, func() { c.Finalize() }, nil
}
