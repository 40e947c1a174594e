package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"sync"

	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/internal/errkind"
)

// Header is the parsed header of a GGUF file (llama.cpp's format, versions 2
// and 3, little-endian): its metadata key/values, in the file's order, and
// its tensors' infos, their data's offsets checked against the file. The
// file is untrusted: every count, length, offset, dimension and type id is
// checked before it is used, and a problem is an ErrMalformed error naming it.
// Values hold copies: the data may be unmapped after Parse returns.
type Header struct {
	Version   uint32
	Metadata  map[string]Value
	Keys      []string // Metadata's keys in the file's order
	Tensors   map[string]TensorInfo
	Names     []string // Tensors' names in the file's order
	Alignment uint64   // general.alignment, 32 when the file gives none
	// DataOffset is where the tensor data begins in the file: the end of
	// the tensor infos, rounded up to Alignment.
	DataOffset uint64
}

// TensorInfo is one tensor's info. Dims are in ggml's order: Dims[0]
// (ne0) is the innermost, contiguous dimension, so a PyTorch [out, in]
// weight has Dims [in, out].
type TensorInfo struct {
	Name string
	Dims []uint64
	Type Type
	// Offset is the data's offset in the file (the tensor info's, which
	// counts from DataOffset, plus DataOffset); Size its bytes.
	Offset, Size uint64
}

// Elements is the tensor's number of values.
func (t TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// ValueType is a metadata value's type id.
type ValueType uint32

// The metadata value types of the GGUF specification.
const (
	Uint8 ValueType = iota
	Int8
	Uint16
	Int16
	Uint32
	Int32
	Float32
	Bool
	String
	Array
	Uint64
	Int64
	Float64
)

var ggufValueNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array",
	"uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(ggufValueNames) {
		return ggufValueNames[t]
	}
	return fmt.Sprintf("type %d", uint32(t))
}

// size is a scalar type's bytes; 0 for strings and arrays.
func (t ValueType) size() int {
	switch t {
	case Uint8, Int8, Bool:
		return 1
	case Uint16, Int16:
		return 2
	case Uint32, Int32, Float32:
		return 4
	case Uint64, Int64, Float64:
		return 8
	}
	return 0
}

// Value is one metadata value: Uint for the unsigned integer types,
// Int for the signed ones, Float for the floating-point ones, Bool, Str, or
// Array (whose elements have type Elem).
type Value struct {
	Type  ValueType
	Uint  uint64
	Int   int64
	Float float64
	Bool  bool
	Str   string
	Elem  ValueType
	Array []Value
}

// AsInt is an integer value of any integer type; ok is false for other
// types and for a uint64 past int64.
func (v Value) AsInt() (int64, bool) {
	switch v.Type {
	case Uint8, Uint16, Uint32, Uint64:
		if v.Uint > math.MaxInt64 {
			return 0, false
		}
		return int64(v.Uint), true
	case Int8, Int16, Int32, Int64:
		return v.Int, true
	}
	return 0, false
}

// AsFloat is a numeric value of any type as a float64.
func (v Value) AsFloat() (float64, bool) {
	switch v.Type {
	case Float32, Float64:
		return v.Float, true
	}
	if i, ok := v.AsInt(); ok {
		return float64(i), true
	}
	return 0, false
}

// Type is a tensor's ggml type id.
type Type uint32

// The ggml types a GGUF file may hold (ggml.h's enum ggml_type; the ids
// ggml removed are not types).
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
)

// ggmlTypeInfo is a type's name, values a block and bytes a block (the
// block structs of ggml-common.h).
var ggmlTypeInfo = map[Type]struct {
	name         string
	block, bytes uint64
}{
	F32: {"F32", 1, 4}, F16: {"F16", 1, 2}, BF16: {"BF16", 1, 2}, F64: {"F64", 1, 8},
	I8: {"I8", 1, 1}, I16: {"I16", 1, 2}, I32: {"I32", 1, 4}, I64: {"I64", 1, 8},
	Q4_0: {"Q4_0", 32, 2 + 16}, Q4_1: {"Q4_1", 32, 4 + 16}, Q5_0: {"Q5_0", 32, 2 + 4 + 16},
	Q5_1: {"Q5_1", 32, 4 + 4 + 16}, Q8_0: {"Q8_0", 32, 2 + 32}, Q8_1: {"Q8_1", 32, 4 + 32},
	MXFP4: {"MXFP4", 32, 1 + 16}, IQ4_NL: {"IQ4_NL", 32, 2 + 16},
	Q2_K: {"Q2_K", 256, 4 + 16 + 64}, Q3_K: {"Q3_K", 256, 32 + 64 + 12 + 2}, Q4_K: {"Q4_K", 256, 4 + 12 + 128},
	Q5_K: {"Q5_K", 256, 4 + 12 + 32 + 128}, Q6_K: {"Q6_K", 256, 128 + 64 + 16 + 2}, Q8_K: {"Q8_K", 256, 4 + 256 + 32},
	IQ2_XXS: {"IQ2_XXS", 256, 2 + 64}, IQ2_XS: {"IQ2_XS", 256, 2 + 64 + 8}, IQ2_S: {"IQ2_S", 256, 2 + 64 + 16},
	IQ3_XXS: {"IQ3_XXS", 256, 2 + 96}, IQ3_S: {"IQ3_S", 256, 2 + 104 + 4}, IQ1_S: {"IQ1_S", 256, 2 + 32 + 16},
	IQ1_M: {"IQ1_M", 256, 32 + 16 + 8}, IQ4_XS: {"IQ4_XS", 256, 2 + 2 + 4 + 128},
	TQ1_0: {"TQ1_0", 256, 48 + 4 + 2}, TQ2_0: {"TQ2_0", 256, 64 + 2},
}

func (t Type) String() string {
	if info, ok := ggmlTypeInfo[t]; ok {
		return info.name
	}
	return fmt.Sprintf("ggml type %d", uint32(t))
}

// BlockSize and BlockBytes are the values in one block of t and the
// block's bytes (1 and the value's bytes for the plain types); 0 for an
// unknown type.
func (t Type) BlockSize() uint64  { return ggmlTypeInfo[t].block }
func (t Type) BlockBytes() uint64 { return ggmlTypeInfo[t].bytes }

// Limits a file is held to, as llama.cpp holds it.
const (
	ggufMagic       = "GGUF"
	ggufMaxDims     = 4     // GGML_MAX_DIMS
	ggufMaxName     = 64    // GGML_MAX_NAME: a tensor name is shorter
	ggufMaxKey      = 65535 // the specification's key limit
	ggufDefaultAlgn = 32
	ggufMaxDepth    = 8       // nested arrays; the specification allows them, files hold none
	ggufMaxValues   = 1 << 22 // array elements in all the metadata
)

// Parse parses data, a whole GGUF file (or at least its header: the
// tensors' data is checked to lie within size bytes, the file's length).
func Parse(data []byte, size uint64) (*Header, error) {
	r := &ggufReader{data: data}
	magic := r.bytes(4, "the magic")
	if r.err != nil {
		return nil, r.err
	}
	if string(magic) != ggufMagic {
		return nil, ggufErr("not a GGUF file: it begins %q, not %q", magic, ggufMagic)
	}
	g := &Header{Version: r.u32("the version"), Metadata: map[string]Value{}, Tensors: map[string]TensorInfo{}}
	switch {
	case r.err != nil:
		return nil, r.err
	case g.Version == 1:
		return nil, ggufErr("GGUF version 1 (32-bit counts) is not read: convert the file again with a current llama.cpp")
	case g.Version != 2 && g.Version != 3:
		if v := bits.ReverseBytes32(g.Version); v >= 1 && v <= 3 {
			return nil, ggufErr("a big-endian GGUF file (version %d byte-swapped): only little-endian files are read", bits.ReverseBytes32(g.Version))
		}
		return nil, ggufErr("GGUF version %d: versions 2 and 3 are read", g.Version)
	}
	nTensors := r.u64("the tensor count")
	nKV := r.u64("the metadata count")
	if r.err != nil {
		return nil, r.err
	}
	// Each key/value takes at least 8 + 1 + 4 + 1 bytes, each tensor info
	// 8 + 4 + 8 + 4 + 8: counts past what the bytes left could hold are
	// refused before anything is allocated for them.
	if nKV > uint64(r.left())/14 {
		return nil, ggufErr("%d metadata key/values in a file of %d bytes", nKV, len(data))
	}
	for i := range nKV {
		key := r.str(fmt.Sprintf("metadata key %d", i), ggufMaxKey)
		if r.err != nil {
			return nil, r.err
		}
		if err := checkKey(key); err != nil {
			return nil, ggufErr("metadata key %d %q: %v", i, key, err)
		}
		if _, dup := g.Metadata[key]; dup {
			return nil, ggufErr("metadata key %q appears twice", key)
		}
		typ := ValueType(r.u32("the type of " + key))
		v := r.value(typ, key, 0)
		if r.err != nil {
			return nil, r.err
		}
		g.Metadata[key] = v
		g.Keys = append(g.Keys, key)
	}
	g.Alignment = ggufDefaultAlgn
	if v, ok := g.Metadata["general.alignment"]; ok {
		a, isInt := v.AsInt()
		if !isInt || a <= 0 || a&(a-1) != 0 {
			return nil, ggufErr("general.alignment is %s %v: it must be a positive power of two", v.Type, ggufShow(v))
		}
		g.Alignment = uint64(a)
	}
	if nTensors > uint64(r.left())/32 {
		return nil, ggufErr("%d tensor infos in a file of %d bytes", nTensors, len(data))
	}
	for i := range nTensors {
		name := r.str(fmt.Sprintf("the name of tensor %d", i), ggufMaxName-1)
		if r.err != nil {
			return nil, r.err
		}
		if _, dup := g.Tensors[name]; dup {
			return nil, ggufErr("tensor %q appears twice", name)
		}
		nd := r.u32("the dimension count of " + name)
		if r.err == nil && (nd < 1 || nd > ggufMaxDims) {
			return nil, ggufErr("tensor %q has %d dimensions: 1 to %d", name, nd, ggufMaxDims)
		}
		t := TensorInfo{Name: name, Dims: make([]uint64, nd)}
		n := uint64(1)
		for d := range t.Dims {
			t.Dims[d] = r.u64(fmt.Sprintf("dimension %d of %s", d, name))
			if r.err != nil {
				return nil, r.err
			}
			if t.Dims[d] == 0 || t.Dims[d] > math.MaxInt64 {
				return nil, ggufErr("tensor %q: dimension %d is %d", name, d, t.Dims[d])
			}
			hi, lo := bits.Mul64(n, t.Dims[d])
			if hi != 0 || lo > math.MaxInt64 {
				return nil, ggufErr("tensor %q: dimensions %v overflow a 64-bit count of values", name, t.Dims)
			}
			n = lo
		}
		t.Type = Type(r.u32("the type of " + name))
		rel := r.u64("the offset of " + name)
		if r.err != nil {
			return nil, r.err
		}
		info, known := ggmlTypeInfo[t.Type]
		if !known {
			return nil, ggufErr("tensor %q: ggml type id %d is not a type GGUF files hold", name, uint32(t.Type))
		}
		if t.Dims[0]%info.block != 0 {
			return nil, ggufErr("tensor %q: its rows of %d values are not whole %s blocks of %d", name, t.Dims[0], info.name, info.block)
		}
		hi, lo := bits.Mul64(n/info.block, info.bytes)
		if hi != 0 || lo > math.MaxInt64 {
			return nil, ggufErr("tensor %q: %d values of %s overflow a 64-bit byte count", name, n, info.name)
		}
		t.Size = lo
		if rel%g.Alignment != 0 {
			return nil, ggufErr("tensor %q: offset %d is not a multiple of the alignment %d", name, rel, g.Alignment)
		}
		t.Offset = rel // made absolute below, once the data's start is known
		g.Tensors[name] = t
		g.Names = append(g.Names, name)
	}
	end := uint64(r.pos)
	g.DataOffset = (end + g.Alignment - 1) / g.Alignment * g.Alignment
	if g.DataOffset > size && nTensors > 0 {
		return nil, ggufErr("the tensor data would begin at byte %d of a %d-byte file", g.DataOffset, size)
	}
	for _, name := range g.Names {
		t := g.Tensors[name]
		if t.Offset > size-min(size, g.DataOffset) || t.Size > size-g.DataOffset-t.Offset {
			return nil, ggufErr("tensor %q: %d bytes at offset %d run past the file's %d bytes of tensor data",
				name, t.Size, t.Offset, size-min(size, g.DataOffset))
		}
		t.Offset += g.DataOffset
		g.Tensors[name] = t
	}
	return g, nil
}

// checkKey holds a key to the specification: ASCII, not empty.
func checkKey(key string) error {
	if key == "" {
		return fmt.Errorf("an empty key")
	}
	for i := 0; i < len(key); i++ {
		if key[i] >= 0x7f || key[i] < 0x20 {
			return fmt.Errorf("byte %d is %#x: keys are printable ASCII", i, key[i])
		}
	}
	return nil
}

func ggufShow(v Value) any {
	switch v.Type {
	case String:
		return v.Str
	case Float32, Float64:
		return v.Float
	case Bool:
		return v.Bool
	case Array:
		return fmt.Sprintf("[%d %s]", len(v.Array), v.Elem)
	}
	if i, ok := v.AsInt(); ok {
		return i
	}
	return v.Uint
}

// ggufReader reads little-endian fields, remembering the first error.
type ggufReader struct {
	data   []byte
	pos    int
	err    error
	values uint64 // array elements read so far
}

func (r *ggufReader) left() int { return len(r.data) - r.pos }

func (r *ggufReader) bytes(n uint64, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(r.left()) {
		r.err = ggufErr("%s: %d bytes needed at byte %d, %d left in the header", what, n, r.pos, r.left())
		return nil
	}
	b := r.data[r.pos : r.pos+int(n)]
	r.pos += int(n)
	return b
}

func (r *ggufReader) u32(what string) uint32 {
	if b := r.bytes(4, what); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *ggufReader) u64(what string) uint64 {
	if b := r.bytes(8, what); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// str reads a GGUF string of at most limit bytes.
func (r *ggufReader) str(what string, limit uint64) string {
	n := r.u64(what)
	if r.err != nil {
		return ""
	}
	if n > limit {
		r.err = ggufErr("%s is %d bytes long: at most %d", what, n, limit)
		return ""
	}
	return string(r.bytes(n, what))
}

// value reads a value of typ for key (depth: the arrays it is inside).
func (r *ggufReader) value(typ ValueType, key string, depth int) Value {
	v := Value{Type: typ}
	if r.err != nil {
		return v
	}
	switch typ {
	case Uint8, Int8:
		b := r.bytes(1, key)
		if b == nil {
			return v
		}
		if typ == Uint8 {
			v.Uint = uint64(b[0])
		} else {
			v.Int = int64(int8(b[0]))
		}
	case Uint16, Int16:
		b := r.bytes(2, key)
		if b == nil {
			return v
		}
		u := binary.LittleEndian.Uint16(b)
		v.Uint, v.Int = uint64(u), int64(int16(u))
		if typ == Uint16 {
			v.Int = 0
		} else {
			v.Uint = 0
		}
	case Uint32:
		v.Uint = uint64(r.u32(key))
	case Int32:
		v.Int = int64(int32(r.u32(key)))
	case Uint64:
		v.Uint = r.u64(key)
	case Int64:
		v.Int = int64(r.u64(key))
	case Float32:
		v.Float = float64(math.Float32frombits(r.u32(key)))
	case Float64:
		v.Float = math.Float64frombits(r.u64(key))
	case Bool:
		b := r.bytes(1, key)
		if b == nil {
			return v
		}
		if b[0] > 1 {
			r.err = ggufErr("metadata %q: a bool of %d (0 or 1)", key, b[0])
			return v
		}
		v.Bool = b[0] == 1
	case String:
		v.Str = r.str("the value of "+key, math.MaxInt64)
	case Array:
		if depth >= ggufMaxDepth {
			r.err = ggufErr("metadata %q: arrays nested %d deep", key, depth+1)
			return v
		}
		v.Elem = ValueType(r.u32("the element type of " + key))
		n := r.u64("the length of " + key)
		if r.err != nil {
			return v
		}
		if int(v.Elem) >= len(ggufValueNames) {
			r.err = ggufErr("metadata %q: an array of value type %d (0 to %d)", key, uint32(v.Elem), len(ggufValueNames)-1)
			return v
		}
		least := uint64(v.Elem.size())
		if least == 0 {
			least = 8 // a string's length, an array's type and length
		}
		if n > uint64(r.left())/least {
			r.err = ggufErr("metadata %q: %d %s values in the %d bytes left", key, n, v.Elem, r.left())
			return v
		}
		// Each value takes a Value (~90 bytes) however few bytes it
		// had in the file: the metadata's values are capped in all, far
		// above what tokenizers hold (~1 M) but far below what a crafted
		// file of a few bytes a value could make us allocate.
		if r.values += n; r.values > ggufMaxValues {
			r.err = ggufErr("metadata %q: more than %d values in the metadata's arrays", key, ggufMaxValues)
			return v
		}
		v.Array = make([]Value, n)
		for i := range v.Array {
			v.Array[i] = r.value(v.Elem, key, depth+1)
			if r.err != nil {
				return v
			}
		}
	default:
		r.err = ggufErr("metadata %q: value type %d (0 to %d)", key, uint32(typ), len(ggufValueNames)-1)
	}
	return v
}

func ggufErr(msg string, args ...any) error {
	return errkind.Errorf(ErrMalformed, "gguf: "+msg, args...)
}

// File is a GGUF file mapped read-only: its parsed header and its
// tensors' bytes, which stay valid until Close. Safe for concurrent reads;
// Close must wait until no slice TensorData returned is in use (a Layer
// made by moe.LoadGGUF closes it in its own Close, after its forward passes).
type File struct {
	Path string
	*Header
	data []byte
	mu   sync.Mutex
}

// Open maps path and parses its header; a file that is not a regular
// file, or not a well-formed GGUF file, is an error naming it.
func Open(path string) (*File, error) {
	data, err := format.MapFile(path, 24, func(size int64) error {
		return errkind.Errorf(ErrMalformed, "gguf: %s: %d bytes: too short for a GGUF header", path, size)
	})
	if err != nil {
		return nil, err
	}
	size := len(data)
	g, err := Parse(data, uint64(size))
	if err != nil {
		format.Unmap(data)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &File{Path: path, Header: g, data: data}, nil
}

// TensorData is tensor name's bytes in the mapping (valid until Close).
func (f *File) TensorData(name string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.data == nil {
		return nil, fmt.Errorf("gguf: %s: %w", f.Path, format.ErrClosed)
	}
	t, ok := f.Tensors[name]
	if !ok {
		return nil, errkind.Errorf(format.ErrMissingTensor, "gguf: %s: no tensor %q", f.Path, name)
	}
	return f.data[t.Offset : t.Offset+t.Size : t.Offset+t.Size], nil
}

// Close unmaps the file; a second Close does nothing.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.data == nil {
		return nil
	}
	err := format.Unmap(f.data)
	f.data = nil
	return err
}
