package safetensors

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/kernels"
)

// file is one memory-mapped safetensors file.
type file struct {
	path string
	data []byte // the whole file, mapped read-only
	hdr  *Header
}

func openFile(path string) (*file, error) {
	data, err := format.MapFile(path, 8, func(size int64) error {
		return fmt.Errorf("safetensors: %s: file of %d bytes is too short for a safetensors header", path, size)
	})
	if err != nil {
		return nil, err
	}
	size := int64(len(data))
	hdr, err := ParseHeader(data, size)
	if err != nil {
		format.Unmap(data)
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	return &file{path: path, data: data, hdr: hdr}, nil
}

func (f *file) close() error {
	if f.data == nil {
		return nil
	}
	err := format.Unmap(f.data)
	f.data = nil
	return err
}

// matrix returns tensor name as a weight matrix of the given shape; a
// vector is a matrix of one row, and wantShape then has one dimension. The
// data stays in the mapping unless it is misaligned for its dtype, in which
// case it is copied once.
func (f *file) matrix(name string, wantShape ...int) (kernels.Matrix, error) {
	t, ok := f.hdr.Tensors[name]
	if !ok {
		return kernels.Matrix{}, errkind.Errorf(format.ErrMissingTensor, "safetensors: %s: missing tensor %q", f.path, name)
	}
	if !slices.Equal(t.Shape, wantShape) {
		return kernels.Matrix{}, errkind.Errorf(format.ErrMissingTensor, "safetensors: %s: tensor %q has shape %v, the config needs %v", f.path, name, t.Shape, wantShape)
	}
	rows, cols := 1, wantShape[len(wantShape)-1]
	if len(wantShape) == 2 {
		rows = wantShape[0]
	}
	raw := f.data[f.hdr.DataBase+t.Begin : f.hdr.DataBase+t.End]
	if m, ok, err := Dense(t.DType, rows, cols, raw); ok {
		return m, err
	}
	switch t.DType {
	case "F8_E5M2":
		return kernels.Matrix{}, errkind.Errorf(format.ErrUnsupported, "safetensors: %s: tensor %q is F8_E5M2: fp8 weights must be e4m3 (F8_E4M3)", f.path, name)
	}
	return kernels.Matrix{}, errkind.Errorf(format.ErrUnsupported, "safetensors: %s: tensor %q has dtype %s, want F32, BF16 or F16", f.path, name, t.DType)
}

// bytes returns the bytes of tensor name, which must be of dtype and have
// exactly shape.
func (f *file) bytes(name, dtype string, shape []int) ([]byte, error) {
	t, ok := f.hdr.Tensors[name]
	if !ok {
		return nil, errkind.Errorf(format.ErrMissingTensor, "safetensors: %s: missing tensor %q", f.path, name)
	}
	if !slices.Equal(t.Shape, shape) {
		return nil, errkind.Errorf(format.ErrMissingTensor, "safetensors: %s: tensor %q has shape %v, the config needs %v", f.path, name, t.Shape, shape)
	}
	if t.DType != dtype {
		return nil, errkind.Errorf(format.ErrUnsupported, "safetensors: %s: tensor %q has dtype %s, want %s", f.path, name, t.DType, dtype)
	}
	return f.data[f.hdr.DataBase+t.Begin : f.hdr.DataBase+t.End], nil
}

// checkShapeTensor checks that tensor name, a shape ([2] of I32 or I64),
// says [rows, cols].
func (f *file) checkShapeTensor(name string, rows, cols int) error {
	t := f.hdr.Tensors[name]
	raw := f.data[f.hdr.DataBase+t.Begin : f.hdr.DataBase+t.End]
	var got []int64
	switch {
	case t.DType == "I32" && slices.Equal(t.Shape, []int{2}):
		got = []int64{int64(int32(binary.LittleEndian.Uint32(raw))), int64(int32(binary.LittleEndian.Uint32(raw[4:])))}
	case t.DType == "I64" && slices.Equal(t.Shape, []int{2}):
		got = []int64{int64(binary.LittleEndian.Uint64(raw)), int64(binary.LittleEndian.Uint64(raw[8:]))}
	default:
		return errkind.Errorf(format.ErrMissingTensor, "safetensors: %s: tensor %q is %s %v, want a shape: I32 or I64 [2]", f.path, name, t.DType, t.Shape)
	}
	if got[0] != int64(rows) || got[1] != int64(cols) {
		return errkind.Errorf(format.ErrMissingTensor, "safetensors: %s: tensor %q says the weight is %v, the config needs [%d %d]", f.path, name, got, rows, cols)
	}
	return nil
}

// Dense is raw, the little-endian values of a dense dtype (F32, BF16 or
// F16), as the row-major matrix [rows, cols] they are: a view, copied once
// when raw is misaligned for the dtype. ok is false for any other dtype.
func Dense(dtype string, rows, cols int, raw []byte) (m kernels.Matrix, ok bool, err error) {
	switch dtype {
	case "F32":
		m, err = kernels.NewF32(rows, cols, format.Cast[float32](raw))
	case "BF16":
		m, err = kernels.NewHalf(kernels.BF16, rows, cols, format.Cast[uint16](raw))
	case "F16":
		m, err = kernels.NewHalf(kernels.F16, rows, cols, format.Cast[uint16](raw))
	default:
		return kernels.Matrix{}, false, nil
	}
	return m, true, err
}
