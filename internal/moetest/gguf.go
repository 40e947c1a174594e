package moetest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
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
	if alignment == 0 || alignment > math.MaxUint32 {
		return fmt.Errorf("moetest: alignment %d", alignment)
	}
	if alignment != 32 {
		kvs = append(slices.Clone(kvs), GGUFKV{Key: "general.alignment", Value: uint32(alignment)})
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
	b.Write(make([]byte, start+off-uint64(b.Len()))) // the last tensor padded too, as llama.cpp writes it
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

// GGUF is m's MoE block as llama.cpp lays it out in a GGUF file of
// architecture arch (deepseek2, qwen3moe, qwen2moe, llama, gpt-oss): the metadata
// its converter writes for the spec, the router (and bias, shared gate) in
// F32, the experts stacked in ggml's order in typ (0 F32, 30 BF16: m's
// weights must be exact in it).
func (m *Model) GGUF(arch string, typ uint32) ([]byte, error) {
	return m.GGUFQuant(arch, typ, nil, nil)
}

// GGUFQuant is GGUF with the routed experts' three stacked tensors given
// as stored bytes: experts["ffn_gate_exps"] and so on, each the experts'
// blocks in order, of ggml type qtypes[name] (m's float64 experts must be
// what they dequantize to, for the reference to hold); nil experts:
// GGUF's.
func (m *Model) GGUFQuant(arch string, typ uint32, qtypes map[string]uint32, experts map[string][]byte) ([]byte, error) {
	kvs, tensors, err := m.ggufParts(arch, typ, qtypes, experts)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := WriteGGUF(&b, kvs, tensors, 32); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// GGUFFused is GGUF with the experts' gate and up projections fused into
// one ffn_gate_up_exps tensor (ggml's dims [hidden, 2·inter, experts]:
// each expert's gate rows, then its up rows), as newer llama.cpp files
// store them.
func (m *Model) GGUFFused(arch string, typ uint32) ([]byte, error) {
	kvs, tensors, err := m.ggufParts(arch, typ, nil, nil)
	if err != nil {
		return nil, err
	}
	var gate, up *GGUFTensor
	var rest []GGUFTensor
	for i := range tensors {
		switch {
		case strings.HasSuffix(tensors[i].Name, "ffn_gate_exps.weight"):
			gate = &tensors[i]
		case strings.HasSuffix(tensors[i].Name, "ffn_up_exps.weight"):
			up = &tensors[i]
		default:
			rest = append(rest, tensors[i])
		}
	}
	E := int(gate.Dims[2])
	per := len(gate.Data) / E
	var data []byte
	for e := range E {
		data = append(append(data, gate.Data[e*per:(e+1)*per]...), up.Data[e*per:(e+1)*per]...)
	}
	rest = append(rest, GGUFTensor{Name: strings.Replace(gate.Name, "ffn_gate_exps", "ffn_gate_up_exps", 1),
		Dims: []uint64{gate.Dims[0], 2 * gate.Dims[1], gate.Dims[2]}, Type: gate.Type, Data: data})
	var b bytes.Buffer
	if err := WriteGGUF(&b, kvs, rest, 32); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// ggufParts is GGUFQuant's metadata and tensors.
func (m *Model) ggufParts(arch string, typ uint32, qtypes map[string]uint32, experts map[string][]byte) ([]GGUFKV, []GGUFTensor, error) {
	if typ != 0 && typ != 30 {
		return nil, nil, fmt.Errorf("moetest: GGUF experts of ggml type %d: F32 (0) or BF16 (30)", typ)
	}
	s := m.Spec
	H, I, E := s.Hidden, s.Inter, s.Experts
	inexact := false
	enc := func(vals []float64) []byte {
		var b []byte
		for _, v := range vals {
			bits := math.Float32bits(float32(v))
			if typ == 30 {
				inexact = inexact || bits&0xffff != 0
				b = binary.LittleEndian.AppendUint16(b, uint16(bits>>16))
			} else {
				b = binary.LittleEndian.AppendUint32(b, bits)
			}
		}
		return b
	}
	f32 := func(vals []float64) []byte {
		v := make([]float32, len(vals))
		for i, x := range vals {
			v[i] = float32(x)
		}
		return F32Bytes(v)
	}
	flat := func(rows [][]float64) []float64 {
		var out []float64
		for _, r := range rows {
			out = append(out, r...)
		}
		return out
	}
	blk := fmt.Sprintf("blk.%d.", s.Layer)
	var gate, up, down []float64
	for _, x := range m.Experts {
		gate, up, down = append(gate, flat(x.Gate)...), append(up, flat(x.Up)...), append(down, flat(x.Down)...)
	}
	u := func(v int) uint64 { return uint64(v) }
	tensors := []GGUFTensor{
		{Name: blk + "ffn_gate_inp.weight", Dims: []uint64{u(H), u(E)}, Type: 0, Data: f32(flat(m.Gate))},
		{Name: blk + "ffn_gate_exps.weight", Dims: []uint64{u(H), u(I), u(E)}, Type: typ, Data: enc(gate)},
		{Name: blk + "ffn_up_exps.weight", Dims: []uint64{u(H), u(I), u(E)}, Type: typ, Data: enc(up)},
		{Name: blk + "ffn_down_exps.weight", Dims: []uint64{u(I), u(H), u(E)}, Type: typ, Data: enc(down)},
	}
	if experts != nil {
		for i, name := range []string{"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"} {
			tensors[1+i].Type, tensors[1+i].Data = qtypes[name], experts[name]
		}
	}
	if m.Shared != nil {
		S := len(m.Shared.Gate)
		tensors = append(tensors,
			GGUFTensor{Name: blk + "ffn_gate_shexp.weight", Dims: []uint64{u(H), u(S)}, Type: typ, Data: enc(flat(m.Shared.Gate))},
			GGUFTensor{Name: blk + "ffn_up_shexp.weight", Dims: []uint64{u(H), u(S)}, Type: typ, Data: enc(flat(m.Shared.Up))},
			GGUFTensor{Name: blk + "ffn_down_shexp.weight", Dims: []uint64{u(S), u(H)}, Type: typ, Data: enc(flat(m.Shared.Down))})
	}
	if m.Bias != nil {
		tensors = append(tensors, GGUFTensor{Name: blk + "exp_probs_b.bias", Dims: []uint64{u(E)}, Type: 0, Data: f32(m.Bias)})
	}
	if m.RouterBias != nil { // gpt-oss: the router's and the experts' biases
		var gb, ub, db []float64
		for _, x := range m.Experts {
			gb, ub, db = append(gb, x.GateBias...), append(ub, x.UpBias...), append(db, x.DownBias...)
		}
		tensors = append(tensors,
			GGUFTensor{Name: blk + "ffn_gate_inp.bias", Dims: []uint64{u(E)}, Type: 0, Data: f32(m.RouterBias)},
			GGUFTensor{Name: blk + "ffn_gate_exps.bias", Dims: []uint64{u(I), u(E)}, Type: 0, Data: f32(gb)},
			GGUFTensor{Name: blk + "ffn_up_exps.bias", Dims: []uint64{u(I), u(E)}, Type: 0, Data: f32(ub)},
			GGUFTensor{Name: blk + "ffn_down_exps.bias", Dims: []uint64{u(H), u(E)}, Type: 0, Data: f32(db)})
	}
	if m.SharedGate != nil {
		tensors = append(tensors, GGUFTensor{Name: blk + "ffn_gate_inp_shexp.weight", Dims: []uint64{u(H)}, Type: 0, Data: f32(m.SharedGate)})
	}
	kv := func(k string, v any) GGUFKV { return GGUFKV{Key: k, Value: v} }
	blocks := max(s.NumLayers, s.Layer+1)
	if arch == "glm4moe" { // llama.cpp counts GLM-4.5's MTP layer among the blocks
		blocks++
	}
	kvs := []GGUFKV{kv("general.architecture", arch), kv(arch+".embedding_length", uint32(H)),
		kv(arch+".block_count", uint32(blocks)), kv(arch+".expert_count", uint32(E)),
		kv(arch+".expert_used_count", uint32(s.TopK))}
	switch arch {
	case "deepseek2", "glm4moe":
		if arch == "glm4moe" {
			kvs = append(kvs, kv(arch+".nextn_predict_layers", uint32(1)))
		}
		gating := uint32(1)
		if s.Scoring == "sigmoid" || arch == "glm4moe" { // GLM-4.5 scores with a sigmoid
			gating = 2
		}
		scaling := s.Scaling
		if scaling == 0 {
			scaling = 1 // the spec's 0 is config.json's default
		}
		kvs = append(kvs, kv(arch+".expert_feed_forward_length", uint32(I)), kv(arch+".expert_shared_count", uint32(s.SharedExperts)),
			kv(arch+".leading_dense_block_count", uint32(s.FirstKDense)), kv(arch+".expert_weights_scale", float32(scaling)),
			kv(arch+".expert_weights_norm", s.NormTopK), kv(arch+".expert_gating_func", gating),
			kv(arch+".expert_group_count", uint32(max(s.NGroup, 1))), kv(arch+".expert_group_used_count", uint32(max(s.TopKGroup, 1))))
	case "qwen3moe", "qwen2moe":
		kvs = append(kvs, kv(arch+".expert_feed_forward_length", uint32(I)))
		if arch == "qwen2moe" {
			kvs = append(kvs, kv(arch+".expert_shared_feed_forward_length", uint32(s.SharedInter)))
		}
	case "llama":
		kvs = append(kvs, kv(arch+".feed_forward_length", uint32(I)))
	case "gpt-oss", "olmoe":
		kvs = append(kvs, kv(arch+".expert_feed_forward_length", uint32(I)))
	}
	if inexact {
		return nil, nil, fmt.Errorf("moetest: a weight of the %s spec is not exact in bf16", s.DType)
	}
	return kvs, tensors, nil
}
