package moe_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/moe"
)

// ggufOf is m's MoE block as a GGUF file of architecture arch.
func ggufOf(t *testing.T, m *moetest.Model, arch string, typ uint32) []byte {
	b, err := m.GGUF(arch, typ)
	require.NoError(t, err)
	return b
}

// TestLoadGGUF: GGUF files of each architecture, F32 and BF16 experts,
// written from a model's weights as llama.cpp lays them out, give the
// float64 reference of the family's Hugging Face definition within 1e-5
// and the same experts.
func TestLoadGGUF(t *testing.T) {
	for _, c := range []struct {
		arch string
		typ  uint32
		spec moetest.Spec
	}{
		{"deepseek2", 0, moetest.Spec{ModelType: "deepseek_v2", Hidden: 64, Experts: 8, TopK: 3, Inter: 32, NumLayers: 3, Layer: 1,
			FirstKDense: 1, SharedExperts: 2, Method: "group_limited_greedy", Scoring: "softmax", NGroup: 4, TopKGroup: 2,
			Scaling: 1.5, DType: "F32", Seed: 81}},
		{"deepseek2", 30, moetest.Spec{ModelType: "deepseek_v3", Hidden: 64, Experts: 8, TopK: 2, Inter: 32, SharedExperts: 1,
			Method: "noaux_tc", Scoring: "sigmoid", NGroup: 2, TopKGroup: 1, NormTopK: true, Scaling: 2.5, DType: "BF16", Seed: 82}},
		{"deepseek2", 30, moetest.Spec{ModelType: "deepseek_v2", Hidden: 32, Experts: 8, TopK: 2, Inter: 16, SharedExperts: 1,
			Method: "greedy", Scoring: "softmax", DType: "BF16", Seed: 83}},
		{"qwen3moe", 0, moetest.Spec{ModelType: "qwen3_moe", Hidden: 64, Experts: 8, TopK: 2, Inter: 32, NormTopK: true, DType: "F32", Seed: 84}},
		{"qwen2moe", 30, moetest.Spec{ModelType: "qwen2_moe", Hidden: 64, Experts: 8, TopK: 2, Inter: 32, SharedInter: 48, DType: "BF16", Seed: 85}},
		{"llama", 0, moetest.Spec{ModelType: "mixtral", Hidden: 64, Experts: 4, TopK: 2, Inter: 32, DType: "F32", Seed: 86}},
		{"glm4moe", 30, moetest.Spec{ModelType: "glm4_moe", Hidden: 64, Experts: 8, TopK: 2, Inter: 32, SharedExperts: 1,
			NormTopK: true, Scaling: 2.5, NGroup: 1, TopKGroup: 1, NumLayers: 3, Layer: 2, FirstKDense: 1, DType: "BF16", Seed: 89}},
	} {
		name := c.arch + "/" + c.spec.ModelType + "/" + c.spec.DType
		m, err := moetest.Generate(c.spec)
		require.NoError(t, err, name)
		path := filepath.Join(t.TempDir(), "m.gguf")
		require.NoError(t, os.WriteFile(path, ggufOf(t, m, c.arch, c.typ), 0o644))
		l, err := moe.LoadGGUF(path, c.spec.Layer)
		require.NoError(t, err, name)
		require.Equal(t, c.spec.ModelType, l.Config.ModelType, name)
		require.Equal(t, max(c.spec.NumLayers, c.spec.Layer+1), l.Config.NumLayers, name)
		x := moetest.Input(c.spec.Seed, 9, c.spec.Hidden, false)
		y := make([]float32, len(x))
		ids := make([]int32, 9*c.spec.TopK)
		require.NoError(t, l.ForwardRouting(context.Background(), x, y, ids, nil), name)
		ref := m.Forward(x)
		require.Equal(t, ref.IDs, ids, name)
		require.LessOrEqual(t, moetest.RelErr(y, ref.Y), 1e-5, name)
		require.NoError(t, l.Close())
		require.NoError(t, l.Close())
	}
}

// TestLoadGGUFErrors: each names its problem.
func TestLoadGGUFErrors(t *testing.T) {
	spec := moetest.Spec{ModelType: "qwen3_moe", Hidden: 32, Experts: 4, TopK: 2, Inter: 16, NormTopK: true, DType: "F32", Seed: 87}
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	good := ggufOf(t, m, "qwen3moe", 0)
	write := func(data []byte) string {
		p := filepath.Join(t.TempDir(), "m.gguf")
		require.NoError(t, os.WriteFile(p, data, 0o644))
		return p
	}
	patch := func(old, new string) []byte {
		i := bytes.Index(good, []byte(old))
		require.GreaterOrEqual(t, i, 0, old)
		out := bytes.Clone(good)
		copy(out[i:], new)
		return out
	}
	_, err = moe.LoadGGUF(write(good), 1)
	require.ErrorContains(t, err, "layer 1")
	_, err = moe.LoadGGUF(write(patch("qwen3moe.expert_count", "qwen3moe.expert_cnunt")), 0)
	require.ErrorIs(t, err, moe.ErrGGUF)
	require.ErrorContains(t, err, "the qwen3moe block needs qwen3moe.expert_count")
	_, err = moe.LoadGGUF(write(patch("blk.0.ffn_up_exps", "blk.0.ffn_uq_exps")), 0)
	require.ErrorIs(t, err, moe.ErrMissingTensor)
	require.ErrorContains(t, err, `missing tensor "blk.0.ffn_up_exps.weight"`)

	other := func(arch string) []byte {
		var b bytes.Buffer
		require.NoError(t, moetest.WriteGGUF(&b, []moetest.GGUFKV{{Key: "general.architecture", Value: arch}}, nil, 32))
		return b.Bytes()
	}
	_, err = moe.LoadGGUF(write(other("gpt2")), 0)
	require.ErrorIs(t, err, moe.ErrUnknownFamily)
	require.ErrorContains(t, err, `GGUF architecture "gpt2"`)
	_, err = moe.LoadGGUF(write(other("llama")), 0)
	require.ErrorContains(t, err, "a llama GGUF without llama.expert_count has no MoE block")

	// Quantized experts: named, not read yet.
	var b bytes.Buffer
	kvs := []moetest.GGUFKV{{Key: "general.architecture", Value: "qwen3moe"}, {Key: "qwen3moe.embedding_length", Value: uint32(32)},
		{Key: "qwen3moe.block_count", Value: uint32(1)}, {Key: "qwen3moe.expert_count", Value: uint32(4)},
		{Key: "qwen3moe.expert_used_count", Value: uint32(2)}, {Key: "qwen3moe.expert_feed_forward_length", Value: uint32(16)}}
	tensors := []moetest.GGUFTensor{
		{Name: "blk.0.ffn_gate_inp.weight", Dims: []uint64{32, 4}, Type: 0, Data: make([]byte, 4*32*4)},
		{Name: "blk.0.ffn_gate_exps.weight", Dims: []uint64{32, 16, 4}, Type: 8, Data: make([]byte, 16*4*34)},
	}
	require.NoError(t, moetest.WriteGGUF(&b, kvs, tensors, 32))
	_, err = moe.LoadGGUF(write(b.Bytes()), 0)
	require.ErrorIs(t, err, moe.ErrUnsupportedFormat)
	require.ErrorContains(t, err, `tensor "blk.0.ffn_gate_exps.weight" is Q8_0`)
}

// TestLoadGGUFSplit: a model split over shards as llama.cpp's gguf-split
// writes it (metadata in the first, split.no and split.count in each, the
// tensors divided) loads from any shard's name; a shard out of place or
// missing is named.
func TestLoadGGUFSplit(t *testing.T) {
	spec := moetest.Spec{ModelType: "qwen3_moe", Hidden: 32, Experts: 4, TopK: 2, Inter: 16, NormTopK: true, DType: "F32", Seed: 88}
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	whole, err := moe.ParseGGUF(ggufOf(t, m, "qwen3moe", 0), 1<<40)
	require.NoError(t, err)
	data := ggufOf(t, m, "qwen3moe", 0)
	var tensors []moetest.GGUFTensor
	for _, name := range whole.Names {
		tn := whole.Tensors[name]
		tensors = append(tensors, moetest.GGUFTensor{Name: name, Dims: tn.Dims, Type: uint32(tn.Type), Data: data[tn.Offset : tn.Offset+tn.Size]})
	}
	var meta []moetest.GGUFKV
	for _, k := range whole.Keys {
		v := whole.Metadata[k]
		switch v.Type {
		case moe.GGUFString:
			meta = append(meta, moetest.GGUFKV{Key: k, Value: v.Str})
		default:
			meta = append(meta, moetest.GGUFKV{Key: k, Value: uint32(v.Uint)})
		}
	}
	dir := t.TempDir()
	shard := func(no, count int, kvs []moetest.GGUFKV, ts []moetest.GGUFTensor) {
		kvs = append(kvs, moetest.GGUFKV{Key: "split.no", Value: uint16(no)}, moetest.GGUFKV{Key: "split.count", Value: uint16(count)})
		var b bytes.Buffer
		require.NoError(t, moetest.WriteGGUF(&b, kvs, ts, 32))
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("m-%05d-of-%05d.gguf", no+1, count)), b.Bytes(), 0o644))
	}
	shard(0, 2, meta, tensors[:2])
	shard(1, 2, nil, tensors[2:])
	x := moetest.Input(1, 5, spec.Hidden, false)
	for _, name := range []string{"m-00001-of-00002.gguf", "m-00002-of-00002.gguf"} {
		l, err := moe.Load(filepath.Join(dir, name), 0)
		require.NoError(t, err, name)
		y := make([]float32, len(x))
		require.NoError(t, l.Forward(context.Background(), x, y))
		require.LessOrEqual(t, moetest.RelErr(y, m.Forward(x).Y), 1e-5)
		require.NoError(t, l.Close())
	}
	// A split DeepSeek-V3: its exp_probs_b only in the second shard still
	// makes the block noaux_tc.
	v3 := moetest.Spec{ModelType: "deepseek_v3", Hidden: 32, Experts: 8, TopK: 2, Inter: 16, SharedExperts: 1,
		Method: "noaux_tc", Scoring: "sigmoid", NGroup: 4, TopKGroup: 2, NormTopK: true, Scaling: 2.5, DType: "F32", Seed: 95}
	mv3, err := moetest.Generate(v3)
	require.NoError(t, err)
	v3data, err := mv3.GGUF("deepseek2", 0)
	require.NoError(t, err)
	whole3, err := moe.ParseGGUF(v3data, uint64(len(v3data)))
	require.NoError(t, err)
	var first, second []moetest.GGUFTensor
	for _, name := range whole3.Names {
		tn := whole3.Tensors[name]
		gt := moetest.GGUFTensor{Name: name, Dims: tn.Dims, Type: uint32(tn.Type), Data: v3data[tn.Offset : tn.Offset+tn.Size]}
		if name == "blk.0.ffn_gate_inp.weight" {
			first = append(first, gt)
		} else {
			second = append(second, gt)
		}
	}
	var meta3 []moetest.GGUFKV
	for _, k := range whole3.Keys {
		switch v := whole3.Metadata[k]; v.Type {
		case moe.GGUFString:
			meta3 = append(meta3, moetest.GGUFKV{Key: k, Value: v.Str})
		case moe.GGUFFloat32:
			meta3 = append(meta3, moetest.GGUFKV{Key: k, Value: float32(v.Float)})
		case moe.GGUFBool:
			meta3 = append(meta3, moetest.GGUFKV{Key: k, Value: v.Bool})
		default:
			meta3 = append(meta3, moetest.GGUFKV{Key: k, Value: uint32(v.Uint)})
		}
	}
	for no, ts := range [][]moetest.GGUFTensor{first, second} {
		kvs := []moetest.GGUFKV{{Key: "split.no", Value: uint16(no)}, {Key: "split.count", Value: uint16(2)}}
		if no == 0 {
			kvs = append(meta3, kvs...)
		}
		var b bytes.Buffer
		require.NoError(t, moetest.WriteGGUF(&b, kvs, ts, 32))
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("v3-%05d-of-00002.gguf", no+1)), b.Bytes(), 0o644))
	}
	l3, err := moe.Load(filepath.Join(dir, "v3-00001-of-00002.gguf"), 0)
	require.NoError(t, err)
	require.Equal(t, moe.NoAuxTC, l3.Config.Method)
	x3 := moetest.Input(2, 6, v3.Hidden, false)
	y3 := make([]float32, len(x3))
	ids3 := make([]int32, 6*v3.TopK)
	require.NoError(t, l3.ForwardRouting(context.Background(), x3, y3, ids3, nil))
	ref3 := mv3.Forward(x3)
	require.Equal(t, ref3.IDs, ids3)
	require.LessOrEqual(t, moetest.RelErr(y3, ref3.Y), 1e-5)
	require.NoError(t, l3.Close())

	shard(0, 2, nil, tensors[2:]) // the second shard's content under the first's name
	_, err = moe.Load(filepath.Join(dir, "m-00002-of-00002.gguf"), 0)
	require.ErrorContains(t, err, "is in both")
	_, err = moe.Load(filepath.Join(dir, "m-00001-of-00003.gguf"), 0)
	require.ErrorContains(t, err, "m-00001-of-00003.gguf")
}

// dequantQ4 is ggml's Q4_0 or MXFP4 blocks of a [rows, cols] matrix as
// float64, written from the format's description (ggml-common.h's block
// structs, ggml-quants.c's dequantize_row_*): a block of 32 values is a
// scale (Q4_0: an f16 d; MXFP4: an E8M0 byte e) and 16 bytes, byte j
// holding value j in its low nibble and value j+16 in its high one; Q4_0's
// value is (q − 8)·d, MXFP4's the e2m1 value of q times 2^(e−127).
func dequantQ4(t *testing.T, typ uint32, blocks []byte, rows, cols int) [][]float64 {
	e2m1 := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}
	bb := 18
	if typ == 39 {
		bb = 17
	}
	out := make([][]float64, rows)
	for i := range out {
		out[i] = make([]float64, cols)
		for b := 0; b < cols/32; b++ {
			blk := blocks[(i*cols/32+b)*bb:][:bb]
			q := blk[bb-16:]
			for j := 0; j < 32; j++ {
				n := q[j%16] & 15
				if j >= 16 {
					n = q[j%16] >> 4
				}
				if typ == 2 {
					h := uint16(blk[0]) | uint16(blk[1])<<8
					d := f16(h)
					out[i][b*32+j] = (float64(n) - 8) * d
				} else {
					out[i][b*32+j] = e2m1[n] * math.Ldexp(1, int(blk[0])-127)
				}
			}
		}
	}
	require.Len(t, blocks, rows*cols/32*bb)
	return out
}

// f16 is an IEEE half's value (normal and subnormal; no infinities or
// NaNs are made here).
func f16(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e, m := int(h>>10&31), float64(h&1023)
	if e == 0 {
		return sign * m * math.Ldexp(1, -24)
	}
	return sign * (1 + m/1024) * math.Ldexp(1, e-15)
}

// TestLoadGGUFQ4: Q4_0 (signed f16 scales) and MXFP4 experts, random
// blocks, give the float64 reference over what the blocks dequantize to
// (an independent dequantizer) within 1e-5, with the same experts; and
// gpt-oss's block as its GGUF files hold it (MXFP4 experts, F32 biases).
func TestLoadGGUFQ4(t *testing.T) {
	for _, c := range []struct {
		typ  uint32
		arch string
		spec moetest.Spec
	}{
		{2, "deepseek2", moetest.Spec{ModelType: "deepseek_v2", Hidden: 64, Experts: 8, TopK: 2, Inter: 32, SharedExperts: 1,
			Method: "greedy", Scoring: "softmax", DType: "F32", Seed: 92}},
		{39, "deepseek2", moetest.Spec{ModelType: "deepseek_v2", Hidden: 64, Experts: 8, TopK: 2, Inter: 32, SharedExperts: 1,
			Method: "greedy", Scoring: "softmax", DType: "F32", Seed: 93}},
		{39, "gpt-oss", moetest.Spec{ModelType: "gpt_oss", Hidden: 64, Experts: 8, TopK: 4, Inter: 32, DType: "BF16", Seed: 94}},
	} {
		typ, spec := c.typ, c.spec
		m, err := moetest.Generate(spec)
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(uint64(typ), 7))
		bb := 18
		if typ == 39 {
			bb = 17
		}
		randomBlocks := func(rows, cols int) []byte {
			b := make([]byte, rows*cols/32*bb)
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			for k := 0; k < len(b); k += bb {
				if typ == 2 { // a signed f16 scale of magnitude 2^-9 to 2^-6
					h := uint16(0x1800+rng.IntN(0x0c00)) | uint16(rng.IntN(2))<<15
					b[k], b[k+1] = byte(h), byte(h>>8)
				} else { // an E8M0 scale of 2^-9 to 2^-6
					b[k] = byte(127 - 9 + rng.IntN(4))
				}
			}
			return b
		}
		data := map[string][]byte{}
		H, I := spec.Hidden, spec.Inter
		for e := range m.Experts {
			for _, p := range []struct {
				name       string
				rows, cols int
				w          *[][]float64
			}{{"ffn_gate_exps", I, H, &m.Experts[e].Gate}, {"ffn_up_exps", I, H, &m.Experts[e].Up}, {"ffn_down_exps", H, I, &m.Experts[e].Down}} {
				blocks := randomBlocks(p.rows, p.cols)
				data[p.name] = append(data[p.name], blocks...)
				*p.w = dequantQ4(t, typ, blocks, p.rows, p.cols)
			}
		}
		file, err := m.GGUFQuant(c.arch, 0, typ, data)
		require.NoError(t, err)
		path := filepath.Join(t.TempDir(), "q.gguf")
		require.NoError(t, os.WriteFile(path, file, 0o644))
		l, err := moe.LoadGGUF(path, 0)
		require.NoError(t, err)
		x := moetest.Input(5, 11, H, false)
		y := make([]float32, len(x))
		ids := make([]int32, 11*spec.TopK)
		require.NoError(t, l.ForwardRouting(context.Background(), x, y, ids, nil))
		ref := m.Forward(x)
		require.Equal(t, ref.IDs, ids, "type %d", typ)
		require.LessOrEqual(t, moetest.RelErr(y, ref.Y), 1e-5, "type %d", typ)
		require.NoError(t, l.Close())
	}
}
