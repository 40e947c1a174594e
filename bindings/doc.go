// Package bindings will hold thin C shims to native libraries, each in its
// own subpackage: NCCL (loaded with dlopen) and MPI.
package bindings
