package gguf

import (
	"encoding/binary"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
)

// Model is a model's GGUF file, or every shard of a split one: its
// metadata (the first shard's) and every shard's tensors by name. Safe for
// concurrent reads; Close must wait until no matrix taken from it is in use.
type Model struct {
	path  string // the first file
	files []*File
	where map[string]*File // tensor name → its file
}

// splitName matches a shard's name: PREFIX-00001-of-00003.gguf.
var splitName = regexp.MustCompile(`^(.*)-(\d{5})-of-(\d{5})\.gguf$`)

// OpenModel maps a GGUF model given its file or, for a split model
// (NAME-00001-of-00003.gguf, llama.cpp's gguf-split), any one of its
// shards, which it reads all of.
func OpenModel(path string) (*Model, error) {
	paths := []string{path}
	if m := splitName.FindStringSubmatch(path); m != nil {
		count, _ := strconv.Atoi(m[3])
		if count < 1 {
			return nil, errkind.Errorf(ErrMalformed, "gguf: %s: a split of %d files", path, count)
		}
		paths = paths[:0]
		for i := 1; i <= count; i++ {
			paths = append(paths, fmt.Sprintf("%s-%05d-of-%05d.gguf", m[1], i, count))
		}
	}
	g := &Model{path: paths[0], where: map[string]*File{}}
	for i, p := range paths {
		f, err := Open(p)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.files = append(g.files, f)
		if len(paths) > 1 {
			no, okNo := f.Metadata["split.no"].AsInt()
			count, okCount := f.Metadata["split.count"].AsInt()
			if okNo && okCount && (no != int64(i) || count != int64(len(paths))) {
				g.Close()
				return nil, errkind.Errorf(ErrMalformed, "gguf: %s says it is split %d of %d, its name shard %d of %d", p, no+1, count, i+1, len(paths))
			}
		}
		for _, name := range f.Names {
			if prev, dup := g.where[name]; dup {
				g.Close()
				return nil, errkind.Errorf(ErrMalformed, "gguf: tensor %q is in both %s and %s", name, prev.Path, p)
			}
			g.where[name] = f
		}
	}
	return g, nil
}

// Close unmaps every file; a second Close does nothing.
func (g *Model) Close() error {
	var first error
	for _, f := range g.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Path is the model's first file.
func (g *Model) Path() string { return g.path }

// Header is the model's metadata and its first file's tensors.
func (g *Model) Header() *Header { return g.files[0].Header }

// Has reports whether any shard holds tensor name.
func (g *Model) Has(name string) bool {
	_, ok := g.where[name]
	return ok
}

// HasSuffix reports whether any shard holds a tensor whose name ends in
// suffix.
func (g *Model) HasSuffix(suffix string) bool {
	for name := range g.where {
		if strings.HasSuffix(name, suffix) {
			return true
		}
	}
	return false
}

// Tensor is name's info, from whichever shard holds it.
func (g *Model) Tensor(name string) (TensorInfo, error) {
	t, _, err := g.tensor(name)
	return t, err
}

// Matrix is tensor name, of PyTorch's shape [rows, cols] (ggml's dims
// [cols, rows]) or [n] (a vector, ggml's [n]), as a weight matrix: F32,
// F16 and BF16 views of the mapping, the 4-bit and integer-code block
// types as kernels' matrices of the same values (see view).
func (g *Model) Matrix(name string, shape ...int) (kernels.Matrix, error) {
	switch len(shape) {
	case 1:
		return g.matrix(name, 1, shape[0])
	case 2:
		return g.matrix(name, shape[0], shape[1])
	}
	return kernels.Matrix{}, errkind.Errorf(format.ErrShape, "gguf: %s: tensor %q asked for as %v: a matrix has one or two dimensions", g.path, name, shape)
}

// Stacked is a 3-D tensor of ggml's dims [cols, rows, n] (PyTorch's
// [n, rows, cols]: a MoE layer's experts) as n matrices [rows, cols].
func (g *Model) Stacked(name string, n, rows, cols int) ([]kernels.Matrix, error) {
	return g.stacked(name, n, rows, cols)
}

// StackedPairs is a 3-D tensor of ggml's dims [cols, 2·rows, n]: n
// matrices [2·rows, cols] each the pair [first; second] of [rows, cols]
// matrices (llama.cpp's ffn_gate_up_exps: an expert's gate rows, then its
// up rows), as the n firsts and the n seconds, views of the mapping.
func (g *Model) StackedPairs(name string, n, rows, cols int) (first, second []kernels.Matrix, err error) {
	t, f, err := g.tensor(name)
	if err != nil {
		return nil, nil, err
	}
	if want := []uint64{uint64(cols), uint64(2 * rows), uint64(n)}; !slices.Equal(t.Dims, want) {
		return nil, nil, errkind.Errorf(format.ErrMissingTensor, "gguf: %s: tensor %q has ggml dims %v, want %v", f.Path, name, t.Dims, want)
	}
	first, second = make([]kernels.Matrix, n), make([]kernels.Matrix, n)
	for e := range first {
		// Rows of blocks are independent: the tensor is 2n matrices
		// [rows, cols], expert e's halves the (2e)th and (2e+1)th.
		if first[e], err = f.view(t, 2*e, rows, cols); err != nil {
			return nil, nil, err
		}
		if second[e], err = f.view(t, 2*e+1, rows, cols); err != nil {
			return nil, nil, err
		}
	}
	return first, second, nil
}

// tensor is name's info and file.
func (g *Model) tensor(name string) (TensorInfo, *File, error) {
	f, ok := g.where[name]
	if !ok {
		return TensorInfo{}, nil, errkind.Errorf(format.ErrMissingTensor, "gguf: %s: missing tensor %q", g.path, name)
	}
	return f.Tensors[name], f, nil
}

// matrix is tensor name as a [rows, cols] matrix: ggml's dims [cols, rows]
// (or [cols] for one row), F32, F16 or BF16, a view of the mapping.
func (g *Model) matrix(name string, rows, cols int) (kernels.Matrix, error) {
	t, f, err := g.tensor(name)
	if err != nil {
		return kernels.Matrix{}, err
	}
	want := []uint64{uint64(cols), uint64(rows)}
	if rows == 1 && len(t.Dims) == 1 {
		want = want[:1]
	}
	if !slices.Equal(t.Dims, want) {
		return kernels.Matrix{}, errkind.Errorf(format.ErrMissingTensor, "gguf: %s: tensor %q has ggml dims %v, want %v", f.Path, name, t.Dims, want)
	}
	return f.view(t, 0, rows, cols)
}

// stacked is a 3-D tensor [cols, rows, n] (ggml's order) as n matrices
// [rows, cols], views of the mapping.
func (g *Model) stacked(name string, n, rows, cols int) ([]kernels.Matrix, error) {
	t, f, err := g.tensor(name)
	if err != nil {
		return nil, err
	}
	if want := []uint64{uint64(cols), uint64(rows), uint64(n)}; !slices.Equal(t.Dims, want) {
		return nil, errkind.Errorf(format.ErrMissingTensor, "gguf: %s: tensor %q has ggml dims %v, want %v", f.Path, name, t.Dims, want)
	}
	out := make([]kernels.Matrix, n)
	for e := range out {
		if out[e], err = f.view(t, e, rows, cols); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// view is matrix k of tensor t ([rows, cols] each, stacked), in place.
func (f *File) view(t TensorInfo, k, rows, cols int) (kernels.Matrix, error) {
	data, err := f.TensorData(t.Name)
	if err != nil {
		return kernels.Matrix{}, err
	}
	per := rows * cols
	switch t.Type {
	case F32:
		v := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(data))), len(data)/4)
		return kernels.NewF32(rows, cols, v[k*per:(k+1)*per])
	case F16, BF16:
		v := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(data))), len(data)/2)
		dt := kernels.F16
		if t.Type == BF16 {
			dt = kernels.BF16
		}
		return kernels.NewHalf(dt, rows, cols, v[k*per:(k+1)*per])
	case Q4_0, MXFP4:
		m, err := q4Blocks(t, data, k, rows, cols)
		if err != nil {
			return m, fmt.Errorf("gguf: %s: %w", f.Path, err)
		}
		return m, nil
	}
	if _, ok := intBlocks[t.Type]; ok {
		m, err := codeBlocks(t, data, k, rows, cols)
		if err != nil {
			return m, fmt.Errorf("gguf: %s: %w", f.Path, err)
		}
		return m, nil
	}
	return kernels.Matrix{}, errkind.Errorf(format.ErrUnsupported,
		"gguf: %s: tensor %q is %s: moex reads GGUF weights in F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and MXFP4",
		f.Path, t.Name, t.Type)
}

// q4Blocks is matrix k of a Q4_0 or MXFP4 tensor as kernels' INT4 (group
// 32) or MXFP4 matrix: the same 4-bit values and per-32 scales, exactly
// (Q4_0: (q − 8)·d with d an f16, so the f32 scale is d; MXFP4: e2m1·2^(e−127),
// what ggml's doubled table times its halved E8M0 scale makes), the
// nibbles reordered from ggml's blocks (byte j of a block: value j low,
// value j + 16 high) to kernels' rows (value c of a row at nibble c, the
// even one low). The nibbles and scales are a copy of the same size.
func q4Blocks(t TensorInfo, data []byte, k, rows, cols int) (kernels.Matrix, error) {
	bb := int(t.Type.BlockBytes())
	perRow := cols / 32
	blocks := data[k*rows*perRow*bb:][:rows*perRow*bb]
	packed := make([]uint8, rows*cols/2)
	var f32 []float32
	var e8m0 []uint8
	if t.Type == Q4_0 {
		f32 = make([]float32, rows*perRow)
	} else {
		e8m0 = make([]uint8, rows*perRow)
	}
	for b := 0; b < rows*perRow; b++ {
		blk := blocks[b*bb:][:bb]
		q := blk[bb-16:]
		if f32 != nil {
			f32[b] = half.F16ToF32(binary.LittleEndian.Uint16(blk))
		} else {
			e8m0[b] = blk[0]
		}
		out := packed[b*16:][:16] // the block's 32 values, two a byte, in order
		for j := range 16 {
			lo, hi := q[j]&15, q[j]>>4
			// value j → nibble j, value j+16 → nibble j+16.
			out[j/2] |= lo << (4 * (j & 1))
			out[8+j/2] |= hi << (4 * (j & 1))
		}
	}
	if f32 != nil {
		m, err := kernels.NewINT4(rows, cols, 32, packed, f32)
		if err != nil {
			return m, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		return m, nil
	}
	m, err := kernels.NewMXFP4(rows, cols, packed, e8m0)
	if err != nil {
		return m, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	return m, nil
}
