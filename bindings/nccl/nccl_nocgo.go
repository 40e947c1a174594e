//go:build !cgo

package nccl

import "errors"

// ErrLibraryNotFound: NCCL is loaded through cgo, which this build lacks.
var ErrLibraryNotFound = errors.New("nccl: library not found (built without cgo)")

// Load cannot load NCCL without cgo.
func Load(path string) error { return ErrLibraryNotFound }

// GetUniqueID cannot work without cgo.
func GetUniqueID() (UniqueID, error) { return UniqueID{}, ErrLibraryNotFound }
