package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// KV is one metadata key and value for Write. The value's Go type gives
// its GGUF type: uint8, int8, uint16, int16, uint32, int32, uint64,
// int64, float32, float64, bool, string, or a slice of one of those but
// bool (an array).
type KV struct {
	Key   string
	Value any
}

// TensorOut is one tensor for Write: Dims in ggml's order (Dims[0] the
// contiguous one), Type its ggml type, Data its bytes as stored, asked
// for once, when the tensor's turn comes, so that a file larger than
// memory can be written tensor by tensor.
type TensorOut struct {
	Name string
	Dims []uint64
	Type Type
	Data func() ([]byte, error)
}

// Size is the tensor's bytes in its type, or an error naming what makes
// it no tensor of that type.
func (t TensorOut) Size() (uint64, error) {
	bs, bb := t.Type.BlockSize(), t.Type.BlockBytes()
	if bs == 0 {
		return 0, fmt.Errorf("gguf: tensor %q: unknown type %v", t.Name, t.Type)
	}
	if len(t.Dims) < 1 || len(t.Dims) > ggufMaxDims {
		return 0, fmt.Errorf("gguf: tensor %q: %d dimensions (1 to %d)", t.Name, len(t.Dims), ggufMaxDims)
	}
	n := uint64(1)
	for _, d := range t.Dims {
		if d == 0 || n > math.MaxUint64/d {
			return 0, fmt.Errorf("gguf: tensor %q: dimensions %v", t.Name, t.Dims)
		}
		n *= d
	}
	if t.Dims[0]%bs != 0 {
		return 0, fmt.Errorf("gguf: tensor %q: rows of %d values are not whole %v blocks of %d", t.Name, t.Dims[0], t.Type, bs)
	}
	return n / bs * bb, nil
}

// Write writes a GGUF version 3 file: the header, kvs in order, the
// tensor infos, and each tensor's data at a multiple of 32 bytes
// (general.alignment is not written; 32 is the default). Tensor names
// must be distinct and shorter than 64 bytes, as llama.cpp reads them;
// each tensor's Data must give exactly its type's bytes for its Dims.
func Write(w io.Writer, kvs []KV, tensors []TensorOut) error {
	const align = ggufDefaultAlgn
	cw := &countWriter{w: w}
	bw := bufio.NewWriterSize(cw, 1<<20)
	var werr error
	put := func(v any) {
		if werr == nil {
			werr = binary.Write(bw, binary.LittleEndian, v)
		}
	}
	str := func(s string) {
		put(uint64(len(s)))
		if werr == nil {
			_, werr = bw.WriteString(s)
		}
	}
	put([]byte(ggufMagic))
	put(uint32(3))
	put(uint64(len(tensors)))
	put(uint64(len(kvs)))
	seen := make(map[string]bool, len(kvs))
	for _, kv := range kvs {
		if err := checkKey(kv.Key); err != nil || seen[kv.Key] {
			return fmt.Errorf("gguf: write: key %q: empty, too long or given twice", kv.Key)
		}
		seen[kv.Key] = true
		str(kv.Key)
		if err := writeValue(kv.Value, put, str); err != nil {
			return fmt.Errorf("gguf: write: key %q: %w", kv.Key, err)
		}
	}
	sizes := make([]uint64, len(tensors))
	names := make(map[string]bool, len(tensors))
	var off uint64
	for i, t := range tensors {
		if t.Name == "" || len(t.Name) >= ggufMaxName || names[t.Name] {
			return fmt.Errorf("gguf: write: tensor name %q: empty, of %d bytes or more, or given twice", t.Name, ggufMaxName)
		}
		names[t.Name] = true
		n, err := t.Size()
		if err != nil {
			return err
		}
		sizes[i] = n
		str(t.Name)
		put(uint32(len(t.Dims)))
		put(t.Dims)
		put(uint32(t.Type))
		put(off)
		off += (n + align - 1) / align * align
	}
	if werr != nil {
		return werr
	}
	pad := func(n uint64) error {
		if r := n % align; r != 0 {
			_, err := bw.Write(make([]byte, align-r))
			return err
		}
		return nil
	}
	if err := pad(cw.n + uint64(bw.Buffered())); err != nil {
		return err
	}
	for i, t := range tensors {
		data, err := t.Data()
		if err != nil {
			return fmt.Errorf("gguf: write: tensor %q: %w", t.Name, err)
		}
		if uint64(len(data)) != sizes[i] {
			return fmt.Errorf("gguf: write: tensor %q: %d bytes of data for %d of %v %v", t.Name, len(data), sizes[i], t.Type, t.Dims)
		}
		if _, err := bw.Write(data); err != nil {
			return err
		}
		if err := pad(sizes[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n uint64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += uint64(n)
	return n, err
}

// writeValue writes a value's type id and the value.
func writeValue(v any, put func(any), str func(string)) error {
	scalar := func(t ValueType, x any) { put(uint32(t)); put(x) }
	array := func(t ValueType, n int, each func(i int)) {
		put(uint32(Array))
		put(uint32(t))
		put(uint64(n))
		for i := range n {
			each(i)
		}
	}
	switch x := v.(type) {
	case uint8:
		scalar(Uint8, x)
	case int8:
		scalar(Int8, x)
	case uint16:
		scalar(Uint16, x)
	case int16:
		scalar(Int16, x)
	case uint32:
		scalar(Uint32, x)
	case int32:
		scalar(Int32, x)
	case uint64:
		scalar(Uint64, x)
	case int64:
		scalar(Int64, x)
	case float32:
		scalar(Float32, x)
	case float64:
		scalar(Float64, x)
	case bool:
		b := uint8(0)
		if x {
			b = 1
		}
		scalar(Bool, b)
	case string:
		put(uint32(String))
		str(x)
	case []string:
		array(String, len(x), func(i int) { str(x[i]) })
	case []uint8:
		array(Uint8, len(x), func(i int) { put(x[i]) })
	case []int32:
		array(Int32, len(x), func(i int) { put(x[i]) })
	case []uint32:
		array(Uint32, len(x), func(i int) { put(x[i]) })
	case []int64:
		array(Int64, len(x), func(i int) { put(x[i]) })
	case []float32:
		array(Float32, len(x), func(i int) { put(x[i]) })
	default:
		return fmt.Errorf("no GGUF type for a %T", v)
	}
	return nil
}
