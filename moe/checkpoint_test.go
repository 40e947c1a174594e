package moe_test

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/internal/stwrite"
	"github.com/moex-project/moex/moe"
)

func TestLoadErrors(t *testing.T) {
	spec := moetest.Spec{ModelType: "deepseek_v2", Hidden: 16, Experts: 4, TopK: 2, Inter: 8, SharedExperts: 1,
		Method: "greedy", Scoring: "softmax", NGroup: 1, TopKGroup: 1, NumLayers: 3, Layer: 1, FirstKDense: 1, DType: "BF16", Seed: 3}
	write := func(t *testing.T, edit func(m *moetest.Model)) string {
		m, err := moetest.Generate(spec)
		require.NoError(t, err)
		if edit != nil {
			edit(m)
		}
		dir := t.TempDir()
		require.NoError(t, m.WriteTo(dir))
		return dir
	}
	drop := func(name string) func(m *moetest.Model) {
		return func(m *moetest.Model) {
			for i, tn := range m.Tensors {
				if tn.Name == name {
					m.Tensors = append(m.Tensors[:i], m.Tensors[i+1:]...)
					return
				}
			}
			panic("no tensor " + name)
		}
	}
	retype := func(name, dtype string, shape []int) func(m *moetest.Model) {
		return func(m *moetest.Model) {
			for i, tn := range m.Tensors {
				if tn.Name == name {
					n := 1
					for _, d := range shape {
						n *= d
					}
					size := map[string]int{"F32": 4, "BF16": 2, "F8_E4M3": 1, "I64": 8}[dtype]
					m.Tensors[i] = stwrite.Tensor{Name: name, DType: dtype, Shape: shape, Data: make([]byte, n*size)}
				}
			}
		}
	}
	tests := []struct {
		name  string
		edit  func(m *moetest.Model)
		layer int
		err   string
		kind  error // the class callers branch on, or nil
	}{
		{"dense layer", nil, 0, "layer 0 is a dense MLP layer (below first_k_dense_replace 1), not MoE", moe.ErrDenseLayer},
		{"layer out of range", nil, 3, "layer 3 out of range: the model has 3 layers", nil},
		{"missing expert tensor", drop("model.layers.1.mlp.experts.2.up_proj.weight"), 1, `missing tensor "model.layers.1.mlp.experts.2.up_proj.weight"`,
			moe.ErrMissingTensor},
		{"missing shared expert", drop("model.layers.1.mlp.shared_experts.down_proj.weight"), 1, `missing tensor "model.layers.1.mlp.shared_experts.down_proj.weight"`,
			moe.ErrMissingTensor},
		{"wrong shape", retype("model.layers.1.mlp.experts.0.gate_proj.weight", "BF16", []int{16, 8}), 1,
			`model.safetensors: tensor "model.layers.1.mlp.experts.0.gate_proj.weight" has shape [16 8], the config needs [8 16]`,
			moe.ErrMissingTensor},
		{"fp8 without a quantization_config", retype("model.layers.1.mlp.experts.3.down_proj.weight", "F8_E4M3", []int{16, 8}), 1,
			`tensor "model.layers.1.mlp.experts.3.down_proj.weight" is F8_E4M3 but config.json has no fp8 quantization_config`,
			moe.ErrUnsupportedFormat},
		{"integer weights", retype("model.layers.1.mlp.gate.weight", "I64", []int{4, 16}), 1,
			`tensor "model.layers.1.mlp.gate.weight" has dtype I64, want F32, BF16 or F16`, moe.ErrUnsupportedFormat},
	}
	classes := []error{moe.ErrDenseLayer, moe.ErrMissingTensor, moe.ErrUnsupportedFormat, moe.ErrShape, moe.ErrNonFinite,
		moe.ErrUnknownFamily, moe.ErrClosed}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := write(t, tt.edit)
			_, err := moe.Load(dir, tt.layer)
			require.ErrorContains(t, err, tt.err)
			for _, c := range classes {
				if c == tt.kind {
					require.ErrorIs(t, err, c)
				} else {
					require.NotErrorIs(t, err, c, "one class only")
				}
			}
		})
	}

	t.Run("no config", func(t *testing.T) {
		_, err := moe.Load(t.TempDir(), 0)
		require.ErrorContains(t, err, "config.json: no such file")
	})
	t.Run("no weights", func(t *testing.T) {
		dir := write(t, nil)
		require.NoError(t, os.Remove(filepath.Join(dir, "model.safetensors")))
		_, err := moe.Load(dir, 1)
		require.ErrorContains(t, err, "no model.safetensors, model.safetensors.index.json or *.safetensors")
	})
	t.Run("unknown model_type", func(t *testing.T) {
		dir := write(t, func(m *moetest.Model) { m.Config["model_type"] = "gpt2" })
		_, err := moe.Load(dir, 1)
		require.ErrorContains(t, err, `config.json: unknown model_type "gpt2"`)
		require.ErrorIs(t, err, moe.ErrUnknownFamily)
	})
	t.Run("truncated file", func(t *testing.T) {
		dir := write(t, nil)
		p := filepath.Join(dir, "model.safetensors")
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(p, b[:len(b)-10], 0o644))
		_, err = moe.Load(dir, 1)
		require.ErrorContains(t, err, "model.safetensors: tensor")
		require.ErrorContains(t, err, "out of bounds")
	})
	t.Run("NaN in the router", func(t *testing.T) {
		const gate = "model.layers.1.mlp.gate.weight"
		dir := write(t, func(m *moetest.Model) {
			for i := range m.Tensors {
				if m.Tensors[i].Name == gate {
					binary.LittleEndian.PutUint16(m.Tensors[i].Data[2*(16+3):], 0x7FC0) // bf16 NaN at [1, 3]
				}
			}
		})
		_, err := moe.Load(dir, 1)
		require.EqualError(t, err, "moe: checkpoint "+dir+": tensor \""+gate+"\" [1, 3] is NaN")
		require.ErrorIs(t, err, moe.ErrNonFinite)
	})
	t.Run("a named pipe for the weights", func(t *testing.T) {
		dir := write(t, nil)
		p := filepath.Join(dir, "model.safetensors")
		require.NoError(t, os.Remove(p))
		require.NoError(t, unix.Mkfifo(p, 0o644))
		_, err := moe.Load(dir, 1) // returns: no writer is waited for
		require.ErrorContains(t, err, p+" is a named pipe, not a regular file")
	})
	t.Run("a directory for config.json", func(t *testing.T) {
		dir := write(t, nil)
		p := filepath.Join(dir, "config.json")
		require.NoError(t, os.Remove(p))
		require.NoError(t, os.Mkdir(p, 0o755))
		_, err := moe.Load(dir, 1)
		require.ErrorContains(t, err, p+" is a directory, not a regular file")
	})
	t.Run("index escaping the folder", func(t *testing.T) {
		dir := write(t, nil)
		idx, err := json.Marshal(map[string]any{"weight_map": map[string]string{"model.layers.1.mlp.gate.weight": "../x.safetensors"}})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644))
		_, err = moe.Load(dir, 1)
		require.ErrorContains(t, err, `maps to "../x.safetensors", which is not a file in the checkpoint folder`)
	})
}

// TestShardsMapLazily: asking for one tensor maps only the shard holding it.
func TestShardsMapLazily(t *testing.T) {
	spec := moetest.Spec{ModelType: "mixtral", Hidden: 8, Experts: 6, TopK: 2, Inter: 4, DType: "F32", Shards: 4, Seed: 1}
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, m.WriteTo(dir))
	ck, err := moe.OpenCheckpoint(dir)
	require.NoError(t, err)
	defer ck.Close()
	require.Empty(t, ck.MappedFiles())
	_, err = ck.Matrix("model.layers.0.block_sparse_moe.experts.5.w2.weight", 8, 4)
	require.NoError(t, err)
	files := ck.MappedFiles()
	require.Len(t, files, 1)
	require.True(t, strings.HasPrefix(files[0], "model-0000"), files[0])
}
