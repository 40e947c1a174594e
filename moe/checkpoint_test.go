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

// rawFile builds safetensors bytes from a header string and a data length.
func rawFile(header string, data int) []byte {
	b := make([]byte, 8, 8+len(header)+data)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, data)...)
}

func TestParseHeader(t *testing.T) {
	good := `{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}}`
	h, err := moe.ParseHeader(rawFile(good, 32), int64(len(rawFile(good, 32))))
	require.NoError(t, err)
	require.Len(t, h.Tensors, 2)
	require.Equal(t, "pt", h.Metadata["format"])
	require.Equal(t, int64(8+len(good)), h.DataBase)

	tests := []struct {
		name   string
		header string
		data   int
		err    string
	}{
		{"offsets past the end", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 4, `tensor "a": data_offsets [0, 8] out of bounds of the 4-byte data section`},
		{"reversed offsets", `{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, 4, `tensor "a": data_offsets [4, 0] out of bounds`},
		{"negative offset", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, 4, `out of bounds`},
		{"shape does not match bytes", `{"w":{"dtype":"BF16","shape":[3,3],"data_offsets":[0,16]}}`, 16, `tensor "w": shape [3 3] of BF16 needs 18 bytes, data_offsets [0, 16] hold 16`},
		{"overlap", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12, `tensors "a" and "b" overlap`},
		{"duplicate name", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8, `header names "a" twice`},
		{"unknown dtype", `{"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}}`, 4, `tensor "a": unknown dtype "F33"`},
		{"negative dim", `{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, 4, `negative dimension`},
		{"huge shape", `{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`, 4, `is too large`},
		{"missing field", `{"a":{"dtype":"F32","shape":[1]}}`, 4, `entry needs dtype, shape and data_offsets`},
		{"three offsets", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, 8, `data_offsets has 3 values`},
		{"not an object", `[1,2]`, 0, `header is not a JSON object`},
		{"trailing data", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} {}`, 4, `data after its JSON object`},
		{"truncated JSON", `{"a":{"dtype":"F32"`, 0, `tensor "a": bad entry`},
		{"bad metadata", `{"__metadata__":{"x":1}}`, 0, `__metadata__ is not a string map`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := rawFile(tt.header, tt.data)
			_, err := moe.ParseHeader(b, int64(len(b)))
			require.ErrorContains(t, err, tt.err)
		})
	}

	_, err = moe.ParseHeader([]byte{1, 2, 3}, 3)
	require.ErrorContains(t, err, "too short")
	b := rawFile(good, 32)
	binary.LittleEndian.PutUint64(b, 1<<40)
	_, err = moe.ParseHeader(b, int64(len(b)))
	require.ErrorContains(t, err, "exceeds")
	binary.LittleEndian.PutUint64(b, uint64(len(b)))
	_, err = moe.ParseHeader(b, int64(len(b)))
	require.ErrorContains(t, err, "runs past the end")
}

// FuzzParseHeader: any bytes give a header or an error, never a panic, and a
// header that parses describes tensors inside the file that do not overlap.
func FuzzParseHeader(f *testing.F) {
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}`, 24))
	f.Add(rawFile(`{"__metadata__":{"k":"v"},"a":{"dtype":"BF16","shape":[],"data_offsets":[0,2]},"b":{"dtype":"I8","shape":[0],"data_offsets":[2,2]}}`, 2))
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}`, 6))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := moe.ParseHeader(data, int64(len(data)))
		if err != nil {
			return
		}
		dataLen := int64(len(data)) - h.DataBase
		require.GreaterOrEqual(t, dataLen, int64(0))
		for name, ti := range h.Tensors {
			require.True(t, 0 <= ti.Begin && ti.Begin <= ti.End && ti.End <= dataLen, "tensor %q out of bounds", name)
		}
	})
}

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

// TestUnalignedTensorData: tensors at offsets misaligned for their dtype
// are read correctly (copied once).
func TestUnalignedTensorData(t *testing.T) {
	vals := []float32{1.5, -2, 3.25, 4}
	var data []byte
	data = append(data, 7) // one byte of something else first
	for _, v := range vals {
		b, err := stwrite.Encode("F32", []float32{v})
		require.NoError(t, err)
		data = append(data, b...)
	}
	hdr := `{"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[1,17]}}`
	raw := append(rawFile(hdr, 0), data...)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.safetensors"), raw, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"),
		[]byte(`{"model_type":"mixtral","hidden_size":2,"num_local_experts":2,"num_experts_per_tok":1,"intermediate_size":2}`), 0o644))
	ck, err := moe.OpenCheckpoint(dir)
	require.NoError(t, err)
	defer ck.Close()
	w, err := ck.Matrix("w", 2, 2)
	require.NoError(t, err)
	require.Equal(t, []float32{1.5, -2, 3.25, 4}, []float32{w.At(0, 0), w.At(0, 1), w.At(1, 0), w.At(1, 1)})
}
