package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/internal/regfile"
	"github.com/moex-project/moex/kernels"
)

// Checkpoint is the weights of a Hugging Face checkpoint folder: one
// model.safetensors, or shards listed in model.safetensors.index.json (or,
// with neither, every *.safetensors in the folder). Shard files are mapped
// lazily, the first time one of their tensors is asked for, so a caller
// that needs a few tensors maps only the files that hold them. Safe for
// concurrent use; each file is mapped once however many callers read it.
type Checkpoint struct {
	Dir string
	// Quant is config.json's quantization_config (nil: none), which says
	// how the quantized tensors are stored.
	Quant *Quantization

	mu       sync.Mutex
	where    map[string]string // tensor name → file name; nil: every file is already open
	files    map[string]*file
	accessed map[string]bool
	closed   bool
}

// Open reads dir's safetensors index (the file names, when there is
// none), with quant the folder's quantization_config (nil: none). It
// returns an error naming the file when the index is missing or malformed.
func Open(dir string, quant *Quantization) (*Checkpoint, error) {
	c := &Checkpoint{Dir: dir, Quant: quant, files: map[string]*file{}}
	index := filepath.Join(dir, "model.safetensors.index.json")
	data, err := regfile.ReadFile(index, maxIndexBytes)
	switch {
	case err == nil:
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(data, &idx); err != nil {
			return nil, fmt.Errorf("safetensors: %s: %w", index, err)
		}
		if len(idx.WeightMap) == 0 {
			return nil, fmt.Errorf("safetensors: %s: empty weight_map", index)
		}
		for name, file := range idx.WeightMap {
			if file == "" || file != filepath.Base(file) || strings.HasPrefix(file, ".") {
				return nil, fmt.Errorf("safetensors: %s: tensor %q maps to %q, which is not a file in the checkpoint folder", index, name, file)
			}
		}
		c.where = idx.WeightMap
		return c, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	// No index: model.safetensors, or else every *.safetensors in the folder.
	paths, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if single := filepath.Join(dir, "model.safetensors"); fileExists(single) {
		paths = []string{single}
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("safetensors: %s: no model.safetensors, model.safetensors.index.json or *.safetensors", dir)
	}
	sort.Strings(paths)
	c.where = map[string]string{}
	for _, p := range paths {
		f, err := c.open(filepath.Base(p))
		if err != nil {
			c.Close()
			return nil, err
		}
		for name := range f.hdr.Tensors {
			if prev, dup := c.where[name]; dup {
				c.Close()
				return nil, fmt.Errorf("safetensors: tensor %q is in both %s and %s", name, prev, filepath.Base(p))
			}
			c.where[name] = filepath.Base(p)
		}
	}
	return c, nil
}

// maxIndexBytes bounds what is read of an index (DeepSeek-V3's is 9 MB).
const maxIndexBytes = 1 << 30

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// open maps a file of the checkpoint once; c.mu is held or c is not shared yet.
func (c *Checkpoint) open(file string) (*file, error) {
	if f, ok := c.files[file]; ok {
		return f, nil
	}
	f, err := openFile(filepath.Join(c.Dir, file))
	if err != nil {
		return nil, err
	}
	c.files[file] = f
	return f, nil
}

// Has reports whether the checkpoint lists tensor name.
func (c *Checkpoint) Has(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.where[name]
	return ok
}

// Matrix returns tensor name, which must have exactly the given shape
// ([rows, cols], or [n] for a vector), as a weight matrix that refers to the
// mapped file: valid until Close.
func (c *Checkpoint) Matrix(name string, shape ...int) (kernels.Matrix, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return kernels.Matrix{}, errkind.Errorf(format.ErrClosed, "safetensors: checkpoint %s is closed", c.Dir)
	}
	if c.accessed == nil {
		c.accessed = map[string]bool{}
	}
	file, ok := c.where[name]
	if !ok {
		if _, packed := c.where[name+"_packed"]; packed {
			if err := c.CheckQuantizable(name, "int4 ("+name+"_packed)"); err != nil {
				return kernels.Matrix{}, err
			}
			return c.int4Matrix(name, shape)
		}
		return kernels.Matrix{}, errkind.Errorf(format.ErrMissingTensor, "safetensors: checkpoint %s: missing tensor %q", c.Dir, name)
	}
	c.accessed[name] = true
	f, err := c.open(file)
	if err != nil {
		return kernels.Matrix{}, err
	}
	t, ok := f.hdr.Tensors[name]
	if !ok {
		return kernels.Matrix{}, errkind.Errorf(format.ErrMissingTensor, "safetensors: %s: missing tensor %q (the index says it is here)", f.path, name)
	}
	if t.DType == "F8_E4M3" {
		if err := c.CheckQuantizable(name, "F8_E4M3"); err != nil {
			return kernels.Matrix{}, err
		}
		return c.fp8Matrix(f, name, shape)
	}
	return f.matrix(name, shape...)
}

// Int32s returns integer tensor name, I32 or I64 of exactly shape, as a
// copy in int32; an I64 value outside int32 is an error naming it.
func (c *Checkpoint) Int32s(name string, shape ...int) ([]int32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errkind.Errorf(format.ErrClosed, "safetensors: checkpoint %s is closed", c.Dir)
	}
	if c.accessed == nil {
		c.accessed = map[string]bool{}
	}
	f, err := c.tensorFile(name)
	if err != nil {
		return nil, err
	}
	t, ok := f.hdr.Tensors[name]
	if !ok {
		return nil, errkind.Errorf(format.ErrMissingTensor, "safetensors: %s: missing tensor %q (the index says it is here)", f.path, name)
	}
	if t.DType != "I32" && t.DType != "I64" {
		return nil, errkind.Errorf(format.ErrUnsupported, "safetensors: %s: tensor %q has dtype %s, want I32 or I64", f.path, name, t.DType)
	}
	raw, err := f.bytes(name, t.DType, shape)
	if err != nil {
		return nil, err
	}
	if t.DType == "I32" {
		out := make([]int32, len(raw)/4)
		for i := range out {
			out[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		return out, nil
	}
	out := make([]int32, len(raw)/8)
	for i := range out {
		v := int64(binary.LittleEndian.Uint64(raw[8*i:]))
		if v != int64(int32(v)) {
			return nil, errkind.Errorf(format.ErrShape, "safetensors: %s: tensor %q holds %d at [%d], outside int32", f.path, name, v, i)
		}
		out[i] = int32(v)
	}
	return out, nil
}

// CheckQuantizable refuses a quantized tensor whose module config.json
// lists as left unquantized: the checkpoint and its config disagree.
func (c *Checkpoint) CheckQuantizable(name, stored string) error {
	module := strings.TrimSuffix(name, ".weight")
	if rule, ok := c.Quant.Unquantized(module); ok {
		return errkind.Errorf(format.ErrUnsupported, "safetensors: checkpoint %s: tensor %q is stored %s but quantization_config's %s leaves module %q unquantized", c.Dir, name, stored, rule, module)
	}
	return nil
}

// tensorFile maps the file that holds tensor name; c.mu is held.
func (c *Checkpoint) tensorFile(name string) (*file, error) {
	file, ok := c.where[name]
	if !ok {
		return nil, errkind.Errorf(format.ErrMissingTensor, "safetensors: checkpoint %s: missing tensor %q", c.Dir, name)
	}
	c.accessed[name] = true
	return c.open(file)
}

// int4Matrix reads the weight name [rows, cols] stored as compressed-
// tensors' pack-quantized int4: name_packed (I32 [rows, cols/8], element
// j of a row at bits 4·(j mod 8) of word j/8, the value plus 8),
// name_scale ([rows, cols/group]) and name_shape ([rows, cols]), the
// scheme config.json declares; c.mu is held.
func (c *Checkpoint) int4Matrix(name string, shape []int) (kernels.Matrix, error) {
	q := c.Quant
	if q == nil || q.Method != "compressed-tensors" {
		return kernels.Matrix{}, errkind.Errorf(format.ErrUnsupported, "safetensors: checkpoint %s: tensor %q is stored packed (%s_packed) but config.json has no compressed-tensors quantization_config", c.Dir, name, name)
	}
	if len(shape) != 2 {
		return kernels.Matrix{}, errkind.Errorf(format.ErrUnsupported, "safetensors: checkpoint %s: tensor %q is int4; only matrices may be", c.Dir, name)
	}
	rows, cols := shape[0], shape[1]
	if cols%8 != 0 || cols%q.GroupSize != 0 {
		return kernels.Matrix{}, errkind.Errorf(format.ErrShape, "safetensors: checkpoint %s: int4 tensor %q has %d columns, not a multiple of 8 and of the group size %d", c.Dir, name, cols, q.GroupSize)
	}
	if _, asym := c.where[name+"_zero_point"]; asym {
		return kernels.Matrix{}, errkind.Errorf(format.ErrUnsupported, "safetensors: checkpoint %s: tensor %q has %s_zero_point: asymmetric int4 is not supported", c.Dir, name, name)
	}
	pname, sname, shname := name+"_packed", name+"_scale", name+"_shape"
	f, err := c.tensorFile(pname)
	if err != nil {
		return kernels.Matrix{}, err
	}
	data, err := f.bytes(pname, "I32", []int{rows, cols / 8})
	if err != nil {
		return kernels.Matrix{}, err
	}
	if shf, err := c.tensorFile(shname); err == nil {
		if err := shf.checkShapeTensor(shname, rows, cols); err != nil {
			return kernels.Matrix{}, err
		}
	} else if !errors.Is(err, format.ErrMissingTensor) {
		return kernels.Matrix{}, err
	}
	sf, err := c.tensorFile(sname)
	if err != nil {
		return kernels.Matrix{}, fmt.Errorf("%w (the scales of int4 tensor %s)", err, name)
	}
	g := cols / q.GroupSize
	sm, err := sf.matrix(sname, rows, g)
	if err != nil {
		return kernels.Matrix{}, fmt.Errorf("%w (the scales of %s in groups of %d)", err, name, q.GroupSize)
	}
	scales := make([]float32, rows*g)
	for r := 0; r < rows; r++ {
		sm.RowF32(r, scales[r*g:][:g])
	}
	m, err := kernels.NewINT4(rows, cols, q.GroupSize, data, scales)
	if err != nil {
		return kernels.Matrix{}, errkind.Errorf(format.ErrUnsupported, "safetensors: %s: tensor %q: %w", f.path, pname, err)
	}
	return m, nil
}

// fp8Matrix reads the FP8 weight name of f with its scales, the tensor
// name + "_scale_inv" ([ceil(rows/block), ceil(cols/block)], F32 or BF16)
// in the block size config.json's quantization_config gives; c.mu is held.
func (c *Checkpoint) fp8Matrix(f *file, name string, shape []int) (kernels.Matrix, error) {
	q := c.Quant
	if q == nil || q.Method != "fp8" {
		return kernels.Matrix{}, errkind.Errorf(format.ErrUnsupported, "safetensors: %s: tensor %q is F8_E4M3 but config.json has no fp8 quantization_config", f.path, name)
	}
	if len(shape) != 2 {
		return kernels.Matrix{}, errkind.Errorf(format.ErrUnsupported, "safetensors: %s: tensor %q is F8_E4M3; only matrices may be fp8", f.path, name)
	}
	data, err := f.bytes(name, "F8_E4M3", shape)
	if err != nil {
		return kernels.Matrix{}, err
	}
	rows, cols := shape[0], shape[1]
	sname := name + "_scale_inv"
	if _, ok := c.where[sname]; !ok {
		return kernels.Matrix{}, errkind.Errorf(format.ErrMissingTensor, "safetensors: checkpoint %s: fp8 tensor %q has no scales %q", c.Dir, name, sname)
	}
	sf, err := c.tensorFile(sname)
	if err != nil {
		return kernels.Matrix{}, err
	}
	gr, gc := (rows+q.BlockRows-1)/q.BlockRows, (cols+q.BlockCols-1)/q.BlockCols
	sm, err := sf.matrix(sname, gr, gc)
	if err != nil {
		return kernels.Matrix{}, fmt.Errorf("%w (the scales of %s in blocks of [%d, %d])", err, name, q.BlockRows, q.BlockCols)
	}
	scales := make([]float32, gr*gc)
	for r := 0; r < gr; r++ {
		sm.RowF32(r, scales[r*gc:][:gc])
	}
	m, err := kernels.NewFP8(rows, cols, data, scales, q.BlockRows, q.BlockCols)
	if err != nil {
		return kernels.Matrix{}, errkind.Errorf(format.ErrUnsupported, "safetensors: %s: tensor %q: %w", f.path, name, err)
	}
	return m, nil
}

// ExplainFault turns a *kernels.FaultError on one of c's mapped files into
// an format.ErrFileChanged error naming the file; other errors pass unchanged.
func (c *Checkpoint) ExplainFault(err error) error {
	var f *kernels.FaultError
	if c == nil || !errors.As(err, &f) {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, sf := range c.files {
		if len(sf.data) == 0 {
			continue
		}
		base := uintptr(unsafe.Pointer(unsafe.SliceData(sf.data)))
		if f.Addr >= base && f.Addr-base < uintptr(len(sf.data)) {
			return errkind.Errorf(format.ErrFileChanged, "safetensors: checkpoint file %s was cut short or replaced in place while it was read: "+
				"its byte %d (of %d when mapped) faulted; replace checkpoint files by renaming new ones into place", sf.path, f.Addr-base, len(sf.data))
		}
	}
	return err
}

// Accessed lists the tensors asked for so far, sorted.
func (c *Checkpoint) Accessed() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for name := range c.accessed {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// MappedFiles lists the files mapped so far, sorted.
func (c *Checkpoint) MappedFiles() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for name := range c.files {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Close unmaps every file. Matrices taken from the checkpoint must not be
// used afterwards.
func (c *Checkpoint) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.close())
	}
	c.files = map[string]*file{}
	c.closed = true
	return errors.Join(errs...)
}

// Tensor is one tensor's entry and its bytes in the mapping.
type Tensor struct {
	Name, Path string // the tensor's name and its file's path
	DType      string
	Shape      []int
	Data       []byte // valid until the checkpoint's Close
}

// Raw is tensor name, which must have exactly shape and one of dtypes, as
// its stored bytes: for weights in a layout of their own (gpt-oss's fused
// MXFP4 experts), which the caller decodes.
func (c *Checkpoint) Raw(name string, shape []int, dtypes ...string) (Tensor, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return Tensor{}, errkind.Errorf(format.ErrClosed, "safetensors: checkpoint %s is closed", c.Dir)
	}
	if c.accessed == nil {
		c.accessed = map[string]bool{}
	}
	f, err := c.tensorFile(name)
	if err != nil {
		return Tensor{}, err
	}
	t, ok := f.hdr.Tensors[name]
	if !ok {
		return Tensor{}, errkind.Errorf(format.ErrMissingTensor, "safetensors: %s: missing tensor %q (the index says it is here)", f.path, name)
	}
	if !slices.Equal(t.Shape, shape) {
		return Tensor{}, errkind.Errorf(format.ErrShape, "safetensors: %s: tensor %q has shape %v, the config needs %v", f.path, name, t.Shape, shape)
	}
	if !slices.Contains(dtypes, t.DType) {
		return Tensor{}, errkind.Errorf(format.ErrUnsupported, "safetensors: %s: tensor %q has dtype %s, want %v", f.path, name, t.DType, dtypes)
	}
	return Tensor{Name: name, Path: f.path, DType: t.DType, Shape: t.Shape, Data: f.data[f.hdr.DataBase+t.Begin : f.hdr.DataBase+t.End]}, nil
}
