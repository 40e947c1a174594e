package moetest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// GGUFKV is one metadata key/value for WriteGGUF. Value is a uint8, int8,
// uint16, int16, uint32, int32, float32, bool, string, uint64, int64,
// float64 or GGUFArray; its Go type gives the GGUF value type.
type GGUFKV struct {
	Key   string
	Value any
}

// GGUFArray is an array value: Elem is the GGUF value type id of its
// elements (the specification's: 0 uint8 … 12 float64), Values the
// elements, each of the Go type WriteGGUF maps to Elem.
type GGUFArray struct {
	Elem   uint32
	Values []any
}

// GGUFTensor is one tensor for WriteGGUF: Dims in ggml's order (Dims[0]
// the contiguous one), Type a ggml type id, Data its bytes as they are
// stored.
type GGUFTensor struct {
	Name string
	Dims []uint64
	Type uint32
	Data []byte
}

// WriteGGUF writes a GGUF version 3 file as the specification
// (ggml/docs/gguf.md) lays it out: the header, the key/values, the tensor
// infos, padding to alignment, each tensor's data at a multiple of
// alignment. It is written from the specification for tests, independently
// of moe's reader; alignment is written as general.alignment when it is
// not 32.
func WriteGGUF(w io.Writer, kvs []GGUFKV, tensors []GGUFTensor, alignment uint64) error {
	if alignment != 32 {
		kvs = append(kvs, GGUFKV{"general.alignment", uint32(alignment)})
	}
	var b bytes.Buffer
	le := func(v any) { binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { le(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	le(uint32(3))
	le(uint64(len(tensors)))
	le(uint64(len(kvs)))
	var value func(v any) error
	value = func(v any) error {
		switch x := v.(type) {
		case string:
			str(x)
		case GGUFArray:
			le(x.Elem)
			le(uint64(len(x.Values)))
			for _, e := range x.Values {
				t, err := ggufTypeOf(e)
				if err != nil {
					return err
				}
				if t != x.Elem {
					return fmt.Errorf("moetest: an array of type %d holds a %T", x.Elem, e)
				}
				if err := value(e); err != nil {
					return err
				}
			}
		case bool:
			if x {
				b.WriteByte(1)
			} else {
				b.WriteByte(0)
			}
		default:
			le(x)
		}
		return nil
	}
	for _, kv := range kvs {
		str(kv.Key)
		t, err := ggufTypeOf(kv.Value)
		if err != nil {
			return err
		}
		le(t)
		if err := value(kv.Value); err != nil {
			return err
		}
	}
	pad := func(n uint64) uint64 { return (n + alignment - 1) / alignment * alignment }
	var off uint64
	offsets := make([]uint64, len(tensors))
	for i, t := range tensors {
		str(t.Name)
		le(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			le(d)
		}
		le(t.Type)
		offsets[i] = off
		le(off)
		off = pad(off + uint64(len(t.Data)))
	}
	b.Write(make([]byte, pad(uint64(b.Len()))-uint64(b.Len())))
	start := uint64(b.Len())
	for i, t := range tensors {
		b.Write(make([]byte, start+offsets[i]-uint64(b.Len())))
		b.Write(t.Data)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// ggufTypeOf is the GGUF value type id of v's Go type.
func ggufTypeOf(v any) (uint32, error) {
	switch v.(type) {
	case uint8:
		return 0, nil
	case int8:
		return 1, nil
	case uint16:
		return 2, nil
	case int16:
		return 3, nil
	case uint32:
		return 4, nil
	case int32:
		return 5, nil
	case float32:
		return 6, nil
	case bool:
		return 7, nil
	case string:
		return 8, nil
	case GGUFArray:
		return 9, nil
	case uint64:
		return 10, nil
	case int64:
		return 11, nil
	case float64:
		return 12, nil
	}
	return 0, fmt.Errorf("moetest: no GGUF value type for %T", v)
}

// F32Bytes is v as little-endian float32 bytes (an F32 tensor's data).
func F32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}
