//go:build !(mpi && cgo)

// Package mpi implements ep.Comm over MPI (Open MPI), one process per rank
// under mpirun. It is built with the mpi build tag and cgo (and needs
// libopenmpi-dev); this build leaves it out.
package mpi
