package model_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/internal/npy"
	"github.com/moex-project/moex/internal/stwrite"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/model"
)

// TestLogitsRecorded: the whole DeepSeek-V2 and V3 models of wholeSpecs
// give, bit for bit, the logits recorded in testdata/recorded before the
// decoder moved onto package arch's configuration (commit e207977's
// model.Load): a 19-token prefill, then three decode steps of two
// sequences over a bf16 cache. MOEX_RECORD=1 writes the files instead.
func TestLogitsRecorded(t *testing.T) {
	for name, spec := range wholeSpecs() {
		t.Run(name, func(t *testing.T) {
			_, m := loadWhole(t, spec, nil)
			ctx := context.Background()
			ids := moetest.Tokens(5, 19, spec.Vocab)
			got, err := m.Prefill(ctx, ids)
			require.NoError(t, err)
			kv, err := m.NewKV(8, 8, kernels.BF16)
			require.NoError(t, err)
			_, err = m.Forward(ctx, kv, []int{0, 0, 0, 1, 1}, ids[:5], nil)
			require.NoError(t, err)
			for step := range 3 {
				logits, err := m.Forward(ctx, kv, []int{0, 1}, ids[6+2*step:8+2*step], nil)
				require.NoError(t, err)
				got = append(got, logits...)
			}
			path := filepath.Join("testdata", "recorded", name+".npy")
			if os.Getenv("MOEX_RECORD") != "" {
				require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
				require.NoError(t, npy.WriteFloat32(path, []int{len(got) / spec.Vocab, spec.Vocab}, got))
				return
			}
			want, err := npy.ReadFloat32(path)
			require.NoError(t, err)
			require.Equal(t, want.Data, got)
		})
	}
}

// TestCheckpointMappedOnce: loading a whole model maps each of its
// checkpoint's files once, shared by every layer (the process's mappings
// as the kernel lists them), and Close unmaps them.
func TestCheckpointMappedOnce(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/self/maps")
	}
	spec := wholeSpecs()["deepseek_v2_f32"]
	w, err := moetest.GenerateWhole(spec)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, stwrite.WriteCheckpoint(dir, w.Config, w.Tensors, 2))
	files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	require.NoError(t, err)
	require.Len(t, files, 2)
	mappings := func() map[string]int {
		data, err := os.ReadFile("/proc/self/maps")
		require.NoError(t, err)
		n := map[string]int{}
		for _, line := range strings.Split(string(data), "\n") {
			for _, f := range files {
				if strings.HasSuffix(line, " "+f) {
					n[f]++
				}
			}
		}
		return n
	}
	m, err := model.Load(dir)
	require.NoError(t, err)
	for _, f := range files {
		require.Equal(t, 1, mappings()[f], "%s: mappings after loading %d layers", f, spec.Layers)
	}
	require.NoError(t, m.Close())
	require.Empty(t, mappings())
}
