package moe

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/internal/hugepage"
	"github.com/moex-project/moex/internal/regfile"
	"github.com/moex-project/moex/kernels"
)

// maxHeaderSize bounds the JSON header of a safetensors file, as the
// reference implementation does.
const maxHeaderSize = 100 << 20

// dtypeSizes are the element sizes of the safetensors dtypes. Any of them
// may appear in a file; F32, BF16, F16 and F8_E4M3 (with its scales) can be
// loaded as weights.
var dtypeSizes = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F4": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// tensorInfo is one entry of a safetensors header.
type tensorInfo struct {
	DType      string
	Shape      []int
	Begin, End int64 // byte offsets into the data section
}

// Header is a parsed, validated safetensors header.
type Header struct {
	Tensors  map[string]tensorInfo
	Metadata map[string]string
	DataBase int64 // offset of the data section in the file: 8 + header length
}

// ParseHeader parses and validates the header of the safetensors file whose
// first bytes are prefix and whose total size is fileSize. Every entry is
// checked: known dtype, non-negative shape whose byte count matches its
// offsets, offsets inside the data section, no two tensors overlapping, no
// duplicate names. The header is untrusted input; bad input gives an error
// naming the tensor, never a panic.
func ParseHeader(prefix []byte, fileSize int64) (*Header, error) {
	if fileSize < 8 || len(prefix) < 8 {
		return nil, fmt.Errorf("file of %d bytes is too short for a safetensors header", fileSize)
	}
	n := binary.LittleEndian.Uint64(prefix)
	if n > maxHeaderSize {
		return nil, fmt.Errorf("header length %d exceeds the %d-byte limit", n, maxHeaderSize)
	}
	if int64(n) > fileSize-8 {
		return nil, fmt.Errorf("header length %d runs past the end of the %d-byte file", n, fileSize)
	}
	if uint64(len(prefix)-8) < n {
		return nil, fmt.Errorf("header length %d, but only %d bytes given", n, len(prefix)-8)
	}
	h := &Header{Tensors: map[string]tensorInfo{}, DataBase: 8 + int64(n)}
	dataLen := fileSize - h.DataBase
	dec := json.NewDecoder(bytes.NewReader(prefix[8 : 8+n]))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("header is not a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("header: %w", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("header: bad key %v", tok)
		}
		if _, dup := h.Tensors[name]; dup || (name == "__metadata__" && h.Metadata != nil) {
			return nil, fmt.Errorf("header names %q twice", name)
		}
		if name == "__metadata__" {
			h.Metadata = map[string]string{}
			if err := dec.Decode(&h.Metadata); err != nil {
				return nil, fmt.Errorf("header: __metadata__ is not a string map: %w", err)
			}
			continue
		}
		var e struct {
			DType   *string  `json:"dtype"`
			Shape   *[]int64 `json:"shape"`
			Offsets *[]int64 `json:"data_offsets"`
		}
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("tensor %q: bad entry: %w", name, err)
		}
		ti, err := checkEntry(e.DType, e.Shape, e.Offsets, dataLen)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		h.Tensors[name] = ti
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("header has data after its JSON object")
	}
	return h, checkOverlap(h.Tensors)
}

func checkEntry(dtype *string, shape, offsets *[]int64, dataLen int64) (tensorInfo, error) {
	var ti tensorInfo
	if dtype == nil || shape == nil || offsets == nil {
		return ti, errors.New("entry needs dtype, shape and data_offsets")
	}
	size, ok := dtypeSizes[*dtype]
	if !ok {
		return ti, fmt.Errorf("unknown dtype %q", *dtype)
	}
	ti.DType = *dtype
	if len(*offsets) != 2 {
		return ti, fmt.Errorf("data_offsets has %d values, want 2", len(*offsets))
	}
	ti.Begin, ti.End = (*offsets)[0], (*offsets)[1]
	if ti.Begin < 0 || ti.End < ti.Begin || ti.End > dataLen {
		return ti, fmt.Errorf("data_offsets [%d, %d] out of bounds of the %d-byte data section", ti.Begin, ti.End, dataLen)
	}
	count := uint64(size)
	for _, d := range *shape {
		if d < 0 {
			return ti, fmt.Errorf("negative dimension in shape %v", *shape)
		}
		hi, lo := bits.Mul64(count, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return ti, fmt.Errorf("shape %v is too large", *shape)
		}
		count = lo
		ti.Shape = append(ti.Shape, int(d))
	}
	if ti.Shape == nil {
		ti.Shape = []int{}
	}
	if count != uint64(ti.End-ti.Begin) {
		return ti, fmt.Errorf("shape %v of %s needs %d bytes, data_offsets [%d, %d] hold %d",
			*shape, *dtype, count, ti.Begin, ti.End, ti.End-ti.Begin)
	}
	return ti, nil
}

func checkOverlap(tensors map[string]tensorInfo) error {
	type span struct {
		name       string
		begin, end int64
	}
	var spans []span
	for name, t := range tensors {
		if t.End > t.Begin {
			spans = append(spans, span{name, t.Begin, t.End})
		}
	}
	slices.SortFunc(spans, func(a, b span) int {
		if c := cmp.Compare(a.begin, b.begin); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return fmt.Errorf("tensors %q and %q overlap", spans[i-1].name, spans[i].name)
		}
	}
	return nil
}

// mapFile maps the regular file path read-only; a file shorter than least
// bytes is the error short makes.
func mapFile(path string, least int64, short func(size int64) error) ([]byte, error) {
	f, err := regfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("moe: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("moe: %w", err)
	}
	size := st.Size()
	if size < least {
		return nil, short(size)
	}
	if size > math.MaxInt {
		return nil, fmt.Errorf("moe: %s: too large to map", path)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("moe: %s: mmap: %w", path, err)
	}
	hugepage.Advise(data) // file-backed: honoured where the kernel has read-only THP for files
	return data, nil
}

// safetensorsFile is one memory-mapped safetensors file.
type safetensorsFile struct {
	path string
	data []byte // the whole file, mapped read-only
	hdr  *Header
}

func openSafetensors(path string) (*safetensorsFile, error) {
	data, err := mapFile(path, 8, func(size int64) error {
		return fmt.Errorf("moe: %s: file of %d bytes is too short for a safetensors header", path, size)
	})
	if err != nil {
		return nil, err
	}
	size := int64(len(data))
	hdr, err := ParseHeader(data, size)
	if err != nil {
		unix.Munmap(data)
		return nil, fmt.Errorf("moe: %s: %w", path, err)
	}
	return &safetensorsFile{path: path, data: data, hdr: hdr}, nil
}

func (f *safetensorsFile) close() error {
	if f.data == nil {
		return nil
	}
	err := unix.Munmap(f.data)
	f.data = nil
	return err
}

// matrix returns tensor name as a weight matrix of the given shape; a
// vector is a matrix of one row, and wantShape then has one dimension. The
// data stays in the mapping unless it is misaligned for its dtype, in which
// case it is copied once.
func (f *safetensorsFile) matrix(name string, wantShape ...int) (kernels.Matrix, error) {
	t, ok := f.hdr.Tensors[name]
	if !ok {
		return kernels.Matrix{}, errkind.Errorf(ErrMissingTensor, "moe: %s: missing tensor %q", f.path, name)
	}
	if !slices.Equal(t.Shape, wantShape) {
		return kernels.Matrix{}, errkind.Errorf(ErrMissingTensor, "moe: %s: tensor %q has shape %v, the config needs %v", f.path, name, t.Shape, wantShape)
	}
	rows, cols := 1, wantShape[len(wantShape)-1]
	if len(wantShape) == 2 {
		rows = wantShape[0]
	}
	raw := f.data[f.hdr.DataBase+t.Begin : f.hdr.DataBase+t.End]
	switch t.DType {
	case "F32":
		return kernels.NewF32(rows, cols, castSlice[float32](raw))
	case "BF16":
		return kernels.NewHalf(kernels.BF16, rows, cols, castSlice[uint16](raw))
	case "F16":
		return kernels.NewHalf(kernels.F16, rows, cols, castSlice[uint16](raw))
	case "F8_E5M2":
		return kernels.Matrix{}, errkind.Errorf(ErrUnsupportedFormat, "moe: %s: tensor %q is F8_E5M2: fp8 weights must be e4m3 (F8_E4M3)", f.path, name)
	}
	return kernels.Matrix{}, errkind.Errorf(ErrUnsupportedFormat, "moe: %s: tensor %q has dtype %s, want F32, BF16 or F16", f.path, name, t.DType)
}

// bytes returns the bytes of tensor name, which must be of dtype and have
// exactly shape.
func (f *safetensorsFile) bytes(name, dtype string, shape []int) ([]byte, error) {
	t, ok := f.hdr.Tensors[name]
	if !ok {
		return nil, errkind.Errorf(ErrMissingTensor, "moe: %s: missing tensor %q", f.path, name)
	}
	if !slices.Equal(t.Shape, shape) {
		return nil, errkind.Errorf(ErrMissingTensor, "moe: %s: tensor %q has shape %v, the config needs %v", f.path, name, t.Shape, shape)
	}
	if t.DType != dtype {
		return nil, errkind.Errorf(ErrUnsupportedFormat, "moe: %s: tensor %q has dtype %s, want %s", f.path, name, t.DType, dtype)
	}
	return f.data[f.hdr.DataBase+t.Begin : f.hdr.DataBase+t.End], nil
}

// checkShapeTensor checks that tensor name, a shape ([2] of I32 or I64),
// says [rows, cols].
func (f *safetensorsFile) checkShapeTensor(name string, rows, cols int) error {
	t := f.hdr.Tensors[name]
	raw := f.data[f.hdr.DataBase+t.Begin : f.hdr.DataBase+t.End]
	var got []int64
	switch {
	case t.DType == "I32" && slices.Equal(t.Shape, []int{2}):
		got = []int64{int64(int32(binary.LittleEndian.Uint32(raw))), int64(int32(binary.LittleEndian.Uint32(raw[4:])))}
	case t.DType == "I64" && slices.Equal(t.Shape, []int{2}):
		got = []int64{int64(binary.LittleEndian.Uint64(raw)), int64(binary.LittleEndian.Uint64(raw[8:]))}
	default:
		return errkind.Errorf(ErrMissingTensor, "moe: %s: tensor %q is %s %v, want a shape: I32 or I64 [2]", f.path, name, t.DType, t.Shape)
	}
	if got[0] != int64(rows) || got[1] != int64(cols) {
		return errkind.Errorf(ErrMissingTensor, "moe: %s: tensor %q says the weight is %v, the config needs [%d %d]", f.path, name, got, rows, cols)
	}
	return nil
}

// castSlice reinterprets little-endian bytes as a slice of T, copying them
// to an aligned buffer when the bytes are not aligned for T.
func castSlice[T float32 | uint16](raw []byte) []T {
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
