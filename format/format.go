// Package format holds what moex's weight-format readers share: the
// classes of error a caller branches on, the tensor-source interface both
// readers satisfy, and read-only file mappings. The readers themselves are
// its subpackages, one a format: format/safetensors (Hugging Face
// checkpoint folders) and format/gguf (llama.cpp's GGUF files). They treat
// files as untrusted input and know nothing of model families: which
// tensor a family needs, and under which name, is the caller's.
package format

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moex-project/moex/internal/hugepage"
	"github.com/moex-project/moex/internal/regfile"
	"github.com/moex-project/moex/kernels"
)

// The classes of error a caller branches on (errors.Is); each error's
// message names the file and the tensor.
var (
	// ErrMissingTensor: a tensor is missing, or has another shape than
	// the caller asked for.
	ErrMissingTensor = errors.New("format: missing or misshapen tensor")
	// ErrUnsupported: a dtype, block type or scheme moex cannot read.
	ErrUnsupported = errors.New("format: unsupported weight format")
	// ErrShape: a value in a tensor that does not fit the shape asked for.
	ErrShape = errors.New("format: bad shape")
	// ErrClosed: a call on a closed checkpoint or file.
	ErrClosed = errors.New("format: closed")
	// ErrFileChanged: a mapped file was cut short or replaced in place
	// while it was read through its mapping.
	ErrFileChanged = errors.New("format: file changed under its mapping")
)

// Source is a model's tensors, whichever format holds them: a
// safetensors checkpoint (*safetensors.Checkpoint) or a GGUF model
// (*gguf.Model). Shapes are PyTorch's, [rows, cols] of a weight [out, in]
// or [n] of a vector; names are the format's own.
type Source interface {
	// Has reports whether the source holds tensor name.
	Has(name string) bool
	// Matrix is tensor name, of exactly shape, as a weight matrix that may
	// refer to the mapped file: valid until Close.
	Matrix(name string, shape ...int) (kernels.Matrix, error)
	// Close unmaps the files; a second Close does nothing.
	Close() error
}

// MapFile maps the regular file path read-only; a file shorter than least
// bytes is the error short makes.
func MapFile(path string, least int64, short func(size int64) error) ([]byte, error) {
	f, err := regfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	if size < least {
		return nil, short(size)
	}
	if size > math.MaxInt {
		return nil, fmt.Errorf("%s: too large to map", path)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%s: mmap: %w", path, err)
	}
	hugepage.Advise(data) // file-backed: honoured where the kernel has read-only THP for files
	return data, nil
}

// Unmap releases a mapping MapFile made.
func Unmap(data []byte) error { return unix.Munmap(data) }

// Cast reinterprets little-endian bytes as a slice of T, copying them
// to an aligned buffer when the bytes are not aligned for T.
func Cast[T float32 | uint16](raw []byte) []T {
	var zero T
	size := int(unsafe.Sizeof(zero))
	n := len(raw) / size
	if n == 0 {
		return []T{}
	}
	if uintptr(unsafe.Pointer(&raw[0]))%uintptr(size) != 0 {
		out := make([]T, n)
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), len(raw)), raw)
		return out
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&raw[0])), n)
}
