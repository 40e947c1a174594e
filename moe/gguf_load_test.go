package moe_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/moe"
)

// ggufOf writes m's MoE block as llama.cpp lays it out in a GGUF file of
// architecture arch: the metadata its converter writes for the spec, the
// router (and bias, shared gate) in F32, the experts stacked in ggml's
// order in typ (0 F32, 30 BF16: m's weights are exact in either).
func ggufOf(t *testing.T, m *moetest.Model, arch string, typ uint32) []byte {
	s := m.Spec
	H, I, E := s.Hidden, s.Inter, s.Experts
	enc := func(vals []float64) []byte {
		var b []byte
		for _, v := range vals {
			bits := math.Float32bits(float32(v))
			if typ == 30 {
				require.Zero(t, bits&0xffff, "a weight not exact in bf16")
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
		return moetest.F32Bytes(v)
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
	tensors := []moetest.GGUFTensor{
		{Name: blk + "ffn_gate_inp.weight", Dims: []uint64{u(H), u(E)}, Type: 0, Data: f32(flat(m.Gate))},
		{Name: blk + "ffn_gate_exps.weight", Dims: []uint64{u(H), u(I), u(E)}, Type: typ, Data: enc(gate)},
		{Name: blk + "ffn_up_exps.weight", Dims: []uint64{u(H), u(I), u(E)}, Type: typ, Data: enc(up)},
		{Name: blk + "ffn_down_exps.weight", Dims: []uint64{u(I), u(H), u(E)}, Type: typ, Data: enc(down)},
	}
	if m.Shared != nil {
		S := len(m.Shared.Gate)
		tensors = append(tensors,
			moetest.GGUFTensor{Name: blk + "ffn_gate_shexp.weight", Dims: []uint64{u(H), u(S)}, Type: typ, Data: enc(flat(m.Shared.Gate))},
			moetest.GGUFTensor{Name: blk + "ffn_up_shexp.weight", Dims: []uint64{u(H), u(S)}, Type: typ, Data: enc(flat(m.Shared.Up))},
			moetest.GGUFTensor{Name: blk + "ffn_down_shexp.weight", Dims: []uint64{u(S), u(H)}, Type: typ, Data: enc(flat(m.Shared.Down))})
	}
	if m.Bias != nil {
		tensors = append(tensors, moetest.GGUFTensor{Name: blk + "exp_probs_b.bias", Dims: []uint64{u(E)}, Type: 0, Data: f32(m.Bias)})
	}
	if m.SharedGate != nil {
		tensors = append(tensors, moetest.GGUFTensor{Name: blk + "ffn_gate_inp_shexp.weight", Dims: []uint64{u(H)}, Type: 0, Data: f32(m.SharedGate)})
	}
	kv := func(k string, v any) moetest.GGUFKV { return moetest.GGUFKV{Key: k, Value: v} }
	kvs := []moetest.GGUFKV{kv("general.architecture", arch), kv(arch+".embedding_length", uint32(H)),
		kv(arch+".block_count", uint32(max(s.NumLayers, s.Layer+1))), kv(arch+".expert_count", uint32(E)),
		kv(arch+".expert_used_count", uint32(s.TopK))}
	switch arch {
	case "deepseek2":
		gating := uint32(1)
		if s.Scoring == "sigmoid" {
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
	}
	var b bytes.Buffer
	require.NoError(t, moetest.WriteGGUF(&b, kvs, tensors, 32))
	return b.Bytes()
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
	} {
		name := c.arch + "/" + c.spec.ModelType + "/" + c.spec.DType
		m, err := moetest.Generate(c.spec)
		require.NoError(t, err, name)
		path := filepath.Join(t.TempDir(), "m.gguf")
		require.NoError(t, os.WriteFile(path, ggufOf(t, m, c.arch, c.typ), 0o644))
		l, err := moe.LoadGGUF(path, c.spec.Layer)
		require.NoError(t, err, name)
		require.Equal(t, c.spec.ModelType, l.Config.ModelType, name)
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
