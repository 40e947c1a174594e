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

	"github.com/moex-project/moex/format/gguf"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
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
		require.Equal(t, max(c.spec.NumLayers, c.spec.Layer+1), l.Arch.Layers, name)
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

// TestLoadGGUFFusedGateUp: experts stored as newer llama.cpp files store
// them, gate and up fused in ffn_gate_up_exps, give the reference's output;
// with expert biases (gpt-oss) the fused tensor is refused by name.
func TestLoadGGUFFusedGateUp(t *testing.T) {
	for _, c := range []struct {
		arch string
		typ  uint32
		spec moetest.Spec
	}{
		{"qwen3moe", 30, moetest.Spec{ModelType: "qwen3_moe", Hidden: 32, Experts: 6, TopK: 2, Inter: 16, NormTopK: true, DType: "BF16", Seed: 91}},
		{"deepseek2", 0, moetest.Spec{ModelType: "deepseek_v2", Hidden: 32, Experts: 8, TopK: 3, Inter: 16, SharedExperts: 1,
			Method: "greedy", Scoring: "softmax", DType: "F32", Seed: 92}},
	} {
		m, err := moetest.Generate(c.spec)
		require.NoError(t, err)
		data, err := m.GGUFFused(c.arch, c.typ)
		require.NoError(t, err)
		path := filepath.Join(t.TempDir(), "fused.gguf")
		require.NoError(t, os.WriteFile(path, data, 0o644))
		l, err := moe.LoadGGUF(path, c.spec.Layer)
		require.NoError(t, err, c.arch)
		x := moetest.Input(c.spec.Seed, 7, c.spec.Hidden, false)
		y := make([]float32, len(x))
		ids := make([]int32, 7*c.spec.TopK)
		require.NoError(t, l.ForwardRouting(context.Background(), x, y, ids, nil))
		ref := m.Forward(x)
		require.Equal(t, ref.IDs, ids, c.arch)
		require.LessOrEqual(t, moetest.RelErr(y, ref.Y), 1e-5, c.arch)
		require.NoError(t, l.Close())
	}
	m, err := moetest.Generate(moetest.Spec{ModelType: "gpt_oss", Hidden: 32, Experts: 4, TopK: 2, Inter: 16, DType: "F32", Seed: 93})
	require.NoError(t, err)
	data, err := m.GGUFFused("gpt-oss", 0)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "oss.gguf")
	require.NoError(t, os.WriteFile(path, data, 0o644))
	_, err = moe.LoadGGUF(path, 0)
	require.ErrorIs(t, err, moe.ErrUnsupportedFormat)
	require.ErrorContains(t, err, `"blk.0.ffn_gate_up_exps.weight" with expert biases is not read yet`)
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

	// Quantized experts of a type moex does not read: named. A block
	// whose f16 scale is infinite: named with its tensor.
	quant := func(typ uint32, values, size int, blocks func([]byte)) []byte {
		var b bytes.Buffer
		kvs := []moetest.GGUFKV{{Key: "general.architecture", Value: "qwen3moe"}, {Key: "qwen3moe.embedding_length", Value: uint32(values)},
			{Key: "qwen3moe.block_count", Value: uint32(1)}, {Key: "qwen3moe.expert_count", Value: uint32(4)},
			{Key: "qwen3moe.expert_used_count", Value: uint32(2)}, {Key: "qwen3moe.expert_feed_forward_length", Value: uint32(16)}}
		data := make([]byte, 16*4*size)
		blocks(data)
		tensors := []moetest.GGUFTensor{
			{Name: "blk.0.ffn_gate_inp.weight", Dims: []uint64{uint64(values), 4}, Type: 0, Data: make([]byte, 4*values*4)},
			{Name: "blk.0.ffn_gate_exps.weight", Dims: []uint64{uint64(values), 16, 4}, Type: typ, Data: data},
		}
		require.NoError(t, moetest.WriteGGUF(&b, kvs, tensors, 32))
		return b.Bytes()
	}
	_, err = moe.LoadGGUF(write(quant(10, 256, 84, func([]byte) {})), 0)
	require.ErrorIs(t, err, moe.ErrUnsupportedFormat)
	require.ErrorContains(t, err, `tensor "blk.0.ffn_gate_exps.weight" is Q2_K`)
	_, err = moe.LoadGGUF(write(quant(8, 32, 34, func(b []byte) { b[3*34+1] = 0x7C })), 0)
	require.ErrorContains(t, err, `tensor "blk.0.ffn_gate_exps.weight" (Q8_0): kernels: int8 scale [3, 0] is +Inf`)
}

// TestLoadGGUFSplit: a model split over shards as llama.cpp's gguf-split
// writes it (metadata in the first, split.no and split.count in each, the
// tensors divided) loads from any shard's name; a shard out of place or
// missing is named.
func TestLoadGGUFSplit(t *testing.T) {
	spec := moetest.Spec{ModelType: "qwen3_moe", Hidden: 32, Experts: 4, TopK: 2, Inter: 16, NormTopK: true, DType: "F32", Seed: 88}
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	whole, err := gguf.Parse(ggufOf(t, m, "qwen3moe", 0), 1<<40)
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
		case gguf.String:
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
	whole3, err := gguf.Parse(v3data, uint64(len(v3data)))
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
		case gguf.String:
			meta3 = append(meta3, moetest.GGUFKV{Key: k, Value: v.Str})
		case gguf.Float32:
			meta3 = append(meta3, moetest.GGUFKV{Key: k, Value: float32(v.Float)})
		case gguf.Bool:
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
// Both in the int8-dot mode: within 2 %, the same experts.
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
		file, err := m.GGUFQuant(c.arch, 0, map[string]uint32{"ffn_gate_exps": typ, "ffn_up_exps": typ, "ffn_down_exps": typ}, data)
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
		// The file's bits a weight, held so in the exact mode: Q4_0's fp16
		// scales, MXFP4's E8M0 bytes (where the weights are packed: not
		// on purego).
		x0, ok := l.Expert(0)
		require.True(t, ok)
		if d := x0.Down; d.Packed() {
			require.Equal(t, map[uint32]float64{2: 4.5, 39: 4.25}[typ], float64(8*d.Bytes())/float64(H*I), "type %d: the down projection's bits a weight", typ)
		}
		// The int8-dot mode: llama.cpp's error, the same experts.
		require.NoError(t, l.SetNumerics(kernels.Int8Dot))
		require.NoError(t, l.ForwardRouting(context.Background(), x, y, ids, nil))
		require.Equal(t, ref.IDs, ids, "type %d (%s) int8dot", typ, c.arch)
		e := moetest.RelErr(y, ref.Y)
		require.Greater(t, e, 1e-5, "type %d (%s) int8dot: the mode was not taken", typ, c.arch)
		require.LessOrEqual(t, e, 2e-2, "type %d (%s) int8dot", typ, c.arch)
		t.Logf("type %d (%s): int8dot relative error %.2g", typ, c.arch, e)
		require.NoError(t, l.Close())
	}
}

// ggmlBlock is a block type of the test: ggml's type id, values and bytes
// a block, and where its f16 scales lie (offsets into a block).
type ggmlBlock struct {
	id, values, bytes int
	f16               []int
}

var codeTypes = map[string]ggmlBlock{
	"Q8_0": {8, 32, 34, []int{0}}, "Q4_0": {2, 32, 18, []int{0}}, "Q4_1": {3, 32, 20, []int{0, 2}}, "Q5_0": {6, 32, 22, []int{0}},
	"Q5_1": {7, 32, 24, []int{0, 2}}, "Q4_K": {12, 256, 144, []int{0, 2}}, "Q5_K": {13, 256, 176, []int{0, 2}},
	"Q6_K": {14, 256, 210, []int{208}},
}

// dequantCodes is ggml's blocks of type name for a [rows, cols] matrix as
// float64, written from the formats' descriptions (ggml-common.h's block
// structs and the dequantize_row_* loops of ggml-quants.c), each value
// rounded once to float32 as ggml's dequantization leaves it:
//
//	Q8_0  d, qs[32] int8:                 qs[j]·d
//	Q4_0  d, qs[16]:                      (q − 8)·d, q as Q4_1's
//	Q4_1  d, m, qs[16]:                   q·d + m, q = low nibble of qs[j] (j < 16) or high of qs[j−16]
//	Q5_0  d, qh (u32), qs[16]:            (q + 16·bit j of qh − 16)·d
//	Q5_1  d, m, qh, qs[16]:               (q + 16·bit j of qh)·d + m
//	Q4_K  d, dmin, scales[12], qs[128]:   q·d·sc − dmin·mn, per 32 values
//	Q5_K  d, dmin, scales[12], qh[32], qs[128]
//	Q6_K  ql[128], qh[64], scales[16] int8, d: (q − 32)·d·sc, per 16 values
//
// The K types' 6-bit scale and min of group g: g < 4: scales[g] & 63 and
// scales[g+4] & 63; else the low (scale) or high (min) nibble of
// scales[g+4] under the top two bits of scales[g−4] (scale) or scales[g]
// (min).
func dequantCodes(name string, blocks []byte, rows, cols int) [][]float64 {
	bt := codeTypes[name]
	out := make([][]float64, rows)
	h := func(b []byte) float64 { return f16(uint16(b[0]) | uint16(b[1])<<8) }
	for r := range out {
		out[r] = make([]float64, cols)
		for bi := 0; bi < cols/bt.values; bi++ {
			b := blocks[(r*cols/bt.values+bi)*bt.bytes:][:bt.bytes]
			v := out[r][bi*bt.values:][:bt.values]
			nib := func(qs []byte, j int) int { // value j of 32 in Q4_0's order
				if j < 16 {
					return int(qs[j] & 15)
				}
				return int(qs[j-16] >> 4)
			}
			scaleMin := func(sc []byte, g int) (float64, float64) {
				if g < 4 {
					return float64(sc[g] & 63), float64(sc[g+4] & 63)
				}
				return float64(sc[g+4]&15 | sc[g-4]>>6<<4), float64(sc[g+4]>>4 | sc[g]>>6<<4)
			}
			switch name {
			case "Q8_0":
				for j := range 32 {
					v[j] = float64(int8(b[2+j])) * h(b)
				}
			case "Q4_0":
				for j := range 32 {
					v[j] = float64(nib(b[2:], j)-8) * h(b)
				}
			case "Q4_1":
				for j := range 32 {
					v[j] = float64(nib(b[4:], j))*h(b) + h(b[2:])
				}
			case "Q5_0", "Q5_1":
				d, m, at := h(b), 0.0, 2
				if name == "Q5_1" {
					m, at = h(b[2:]), 4
				}
				qh := uint32(b[at]) | uint32(b[at+1])<<8 | uint32(b[at+2])<<16 | uint32(b[at+3])<<24
				for j := range 32 {
					q := float64(nib(b[at+4:], j)) + 16*float64(qh>>j&1)
					if name == "Q5_0" {
						q -= 16
					}
					v[j] = q*d + m
				}
			case "Q4_K", "Q5_K":
				d, dmin := h(b), h(b[2:])
				qs := b[16:144]
				if name == "Q5_K" {
					qs = b[48:176]
				}
				for j := range 256 {
					g, l := j/32, j%32 // group g: bytes 32·(g/2)…, low nibble for even g
					q := int(qs[32*(g/2)+l] & 15)
					if g%2 == 1 {
						q = int(qs[32*(g/2)+l] >> 4)
					}
					if name == "Q5_K" && b[16+l]>>g&1 == 1 {
						q += 16
					}
					sc, mn := scaleMin(b[4:16], g)
					v[j] = float64(q)*d*sc - dmin*mn
				}
			case "Q6_K":
				d := h(b[208:])
				for j := range 256 {
					n, r := j/128, j%128 // half n; r in 0…127: quarter r/32, l = r%32
					l, quarter := r%32, r/32
					ql := b[64*n+l+32*(quarter%2)]
					q := int(ql & 15)
					if quarter >= 2 {
						q = int(ql >> 4)
					}
					q |= int(b[128+32*n+l]>>(2*quarter)&3) << 4
					v[j] = float64(q-32) * d * float64(int8(b[192+j/16]))
				}
			}
			for j := range v {
				v[j] = float64(float32(v[j]))
			}
		}
	}
	return out
}

// TestLoadGGUFCodes: experts in each of ggml's integer-code block types
// (random blocks, f16 scales of magnitude 2^-9 to 2^-5, signed where ggml
// allows), and a Q4_K_M-like mix (gate and up Q4_K, down Q6_K), give the
// float64 reference over what an independent dequantizer makes of the
// blocks within 1e-5, choosing the same experts; on every implementation.
// In the int8-dot mode, the same experts, within 2 % of the reference
// (rounding the activations to int8), and a token's bits alone as in the
// batch (kernels' TestInt8Dot checks the mode's bits on every
// implementation; the F32 shared expert here stays exact).
func TestLoadGGUFCodes(t *testing.T) {
	spec := moetest.Spec{ModelType: "deepseek_v2", Hidden: 256, Experts: 8, TopK: 2, Inter: 512, SharedExperts: 1,
		Method: "greedy", Scoring: "softmax", DType: "F32", Seed: 96}
	cases := [][3]string{{"Q4_K", "Q4_K", "Q6_K"}}
	for _, name := range []string{"Q8_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q4_0"} {
		cases = append(cases, [3]string{name, name, name})
	}
	impls := kernels.Implementations()
	for ci, types := range cases {
		m, err := moetest.Generate(spec)
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(uint64(ci), 8))
		randomBlocks := func(name string, rows, cols int) []byte {
			bt := codeTypes[name]
			b := make([]byte, rows*cols/bt.values*bt.bytes)
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			for k := 0; k < len(b); k += bt.bytes {
				for _, at := range bt.f16 {
					hv := uint16(0x1800 + rng.IntN(0x1000)) // 2^-9 … 2^-5
					if name == "Q8_0" || name == "Q4_0" || name == "Q5_0" || name == "Q6_K" || at == 2 {
						hv |= uint16(rng.IntN(2)) << 15 // signed: d of the symmetric types, m and dmin
					}
					b[k+at], b[k+at+1] = byte(hv), byte(hv>>8)
				}
			}
			return b
		}
		data, qtypes := map[string][]byte{}, map[string]uint32{}
		H, I := spec.Hidden, spec.Inter
		for e := range m.Experts {
			for pi, p := range []struct {
				name       string
				rows, cols int
				w          *[][]float64
			}{{"ffn_gate_exps", I, H, &m.Experts[e].Gate}, {"ffn_up_exps", I, H, &m.Experts[e].Up}, {"ffn_down_exps", H, I, &m.Experts[e].Down}} {
				blocks := randomBlocks(types[pi], p.rows, p.cols)
				data[p.name] = append(data[p.name], blocks...)
				qtypes[p.name] = uint32(codeTypes[types[pi]].id)
				*p.w = dequantCodes(types[pi], blocks, p.rows, p.cols)
			}
		}
		file, err := m.GGUFQuant("deepseek2", 0, qtypes, data)
		require.NoError(t, err)
		path := filepath.Join(t.TempDir(), "q.gguf")
		require.NoError(t, os.WriteFile(path, file, 0o644))
		x := moetest.Input(5, 21, H, false)
		ref := m.Forward(x)
		logged := false
		for _, impl := range impls {
			restore, err := kernels.Use(impl)
			require.NoError(t, err)
			l, err := moe.LoadGGUF(path, 0)
			require.NoError(t, err)
			y := make([]float32, len(x))
			ids := make([]int32, 21*spec.TopK)
			require.NoError(t, l.ForwardRouting(context.Background(), x, y, ids, nil))
			require.Equal(t, ref.IDs, ids, "%v on %s", types, impl)
			require.LessOrEqual(t, moetest.RelErr(y, ref.Y), 1e-5, "%v on %s", types, impl)

			if bits, ok := map[string]int64{"Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q6_K": 6}[types[2]]; ok { // held in their bits
				x0, ok := l.Expert(0)
				require.True(t, ok)
				if d := x0.Down; d.Packed() { // row-major where no kernels run packed weights (purego)
					require.Equal(t, int64(H*I)*bits/8, d.Bytes()-int64(d.ScaleBytes()), "%v: the down projection's codes", types)
				}
			}
			// The int8-dot mode, asked for: llama.cpp's error, not ours.
			require.Equal(t, kernels.Exact, l.Numerics())
			require.NoError(t, l.SetNumerics(kernels.Int8Dot))
			require.Equal(t, kernels.Int8Dot, l.Numerics())
			if bits, ok := map[string]int64{"Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q6_K": 6}[types[2]]; ok { // held in their bits
				x0, ok := l.Expert(0)
				require.True(t, ok)
				d := x0.Down
				require.Equal(t, int64(H*I)*bits/8, d.Bytes()-int64(d.ScaleBytes()), "%v int8dot: the down projection's codes", types)
			}
			if bits, ok := map[string]float64{"Q8_0": 8.5, "Q4_0": 4.5, "Q4_1": 5, "Q5_0": 5.5, "Q5_1": 6}[types[2]]; ok { // the file's bits: fp16 scales
				x0, ok := l.Expert(0)
				require.True(t, ok)
				require.Equal(t, bits, float64(8*x0.Down.Bytes())/float64(H*I), "%v int8dot: the down projection's bits a weight", types)
			}
			require.NoError(t, l.ForwardRouting(context.Background(), x, y, ids, nil))
			require.Equal(t, ref.IDs, ids, "%v int8dot on %s", types, impl)
			e := moetest.RelErr(y, ref.Y)
			require.Greater(t, e, 1e-5, "%v int8dot on %s: the mode was not taken", types, impl)
			require.LessOrEqual(t, e, 2e-2, "%v int8dot on %s", types, impl)
			if !logged {
				t.Logf("%v: int8dot relative error %.2g", types, e)
				logged = true
			}
			one := make([]float32, H) // a token alone: its bits in the batch
			require.NoError(t, l.Forward(context.Background(), x[7*H:8*H], one))
			require.Equal(t, y[7*H:8*H], one, "%v int8dot on %s: token 7 alone", types, impl)
			require.ErrorContains(t, l.SetNumerics(kernels.Exact), "cannot go to exact: load it again")
			require.NoError(t, l.Close())
			restore()
		}
	}
}

// TestSetNumericsRefused: a layer whose experts the int8-dot mode is not
// defined on says so, naming the matrix, and stays exact.
func TestSetNumericsRefused(t *testing.T) {
	spec := moetest.Spec{ModelType: "qwen3_moe", Hidden: 64, Experts: 4, TopK: 2, Inter: 32, NormTopK: true, DType: "BF16", Seed: 97}
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	file, err := m.GGUF("qwen3moe", 30)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "bf16.gguf")
	require.NoError(t, os.WriteFile(path, file, 0o644))
	l, err := moe.LoadGGUF(path, 0)
	require.NoError(t, err)
	defer l.Close()
	err = l.SetNumerics(kernels.Int8Dot)
	require.ErrorIs(t, err, moe.ErrUnsupportedFormat)
	require.ErrorContains(t, err, "expert 0's gate: kernels: int8dot numerics need UINT4, INT8, MXFP4 or INT4 weights, have BF16")
	require.Equal(t, kernels.Exact, l.Numerics())
	require.NoError(t, l.SetNumerics(kernels.Exact))
}
