package model_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/model"
)

// gqaSpecs: a whole model of each grouped-query family moex runs
// (moetest.GQAFamilies).
func gqaSpecs() map[string]moetest.WholeSpec { return moetest.GQAFamilies() }

// TestWholeFamiliesMatchReference: each family's logits at every position
// of a prefill within 1e-4 of the float64 reference written from its
// transformers modeling file, the same argmax; then the same tokens fed
// one to three at a time through a bf16 cache give the prefill's argmax.
func TestWholeFamiliesMatchReference(t *testing.T) {
	for name, spec := range gqaSpecs() {
		t.Run(name, func(t *testing.T) {
			w, m := loadWhole(t, spec, nil)
			require.Equal(t, spec.Layers, m.NumLayers())
			ids := moetest.Tokens(7, 19, spec.Vocab)
			_, flat := prefillMatchesReference(t, w, m, ids, spec.Vocab)
			kv, err := m.NewKV(8, 4, kernels.F32)
			require.NoError(t, err)
			var steps []float32
			for p := 0; p < len(ids); {
				n := min(len(ids)-p, 1+p%3)
				seqs := make([]int, n)
				out, err := m.Forward(context.Background(), kv, seqs, ids[p:p+n], nil)
				require.NoError(t, err)
				steps = append(steps, out...)
				p += n
			}
			require.Less(t, moetest.RelErr(steps, flat), 1e-4, "in steps over a paged cache")
		})
	}
}

// TestWholeGGUF: the same weights written as llama.cpp's converter writes
// them (its names, ggml's order, Mixtral's q and k rows permuted for
// llama.cpp's pair rotation) give, from the GGUF file, the logits of the
// safetensors folder and of the float64 reference.
func TestWholeGGUF(t *testing.T) {
	for _, c := range []struct{ name, arch string }{{"qwen3_moe_f32", "qwen3moe"}, {"qwen2_moe_bf16", "qwen2moe"}, {"mixtral_f32_window", "llama"},
		{"gpt_oss_bf16", "gpt-oss"}, {"glm4_moe_f32", "glm4moe"}, {"olmoe_bf16", "olmoe"}} {
		t.Run(c.name, func(t *testing.T) {
			spec := moetest.ForGGUF(gqaSpecs()[c.name], c.arch)
			w, st := loadWhole(t, spec, nil)
			data, err := w.GGUF(c.arch)
			require.NoError(t, err)
			path := filepath.Join(t.TempDir(), "model.gguf")
			require.NoError(t, os.WriteFile(path, data, 0o644))
			m, err := model.Load(path)
			require.NoError(t, err)
			defer m.Close()
			require.Equal(t, spec.Vocab, m.Vocab)
			sameAsFolder(t, m, st, w, moetest.Tokens(8, 17, spec.Vocab), c.name)
		})
	}
	// DeepSeek-V2 and V3 (MLA, a dense leading layer; V3 with q-LoRA and
	// yarn), kv_b whole and split per head as newer files store it.
	for _, name := range []string{"deepseek_v2_f32", "deepseek_v3_bf16"} {
		for _, split := range []bool{false, true} {
			spec := wholeSpecs()[name]
			w, st := loadWhole(t, spec, nil)
			data, err := w.GGUFSplit("deepseek2", split)
			require.NoError(t, err)
			path := filepath.Join(t.TempDir(), "ds.gguf")
			require.NoError(t, os.WriteFile(path, data, 0o644))
			m, err := model.Load(path)
			require.NoError(t, err, name)
			sameAsFolder(t, m, st, w, moetest.Tokens(9, 13, spec.Vocab), fmt.Sprintf("%s split %v", name, split))
			require.NoError(t, m.Close())
		}
	}
}

// TestKVCacheDType: a bf16 cache (serve's, bench model's default) against
// the float64 reference: the error it adds is bf16's rounding of the
// cached keys and values (and latents), within 1e-2; an fp32 cache stays
// within the exact mode's 1e-4.
func TestKVCacheDType(t *testing.T) {
	for _, name := range []string{"qwen3_moe_f32", "gpt_oss_bf16"} {
		spec := gqaSpecs()[name]
		w, m := loadWhole(t, spec, nil)
		ids := moetest.Tokens(11, 17, spec.Vocab)
		var want []float64
		for _, row := range w.Logits(ids) {
			want = append(want, row...)
		}
		errs := map[kernels.DType]float64{}
		for _, c := range []struct {
			dt  kernels.DType
			tol float64
		}{{kernels.F32, 1e-4}, {kernels.BF16, 1e-2}, {kernels.F16, 2e-3}} {
			got := prefillAlone(t, m, ids, c.dt)
			all, err := m.Forward(context.Background(), mustKV(t, m, c.dt), make([]int, len(ids)), ids, seqRows(len(ids)))
			require.NoError(t, err)
			require.Equal(t, got[len(got)-spec.Vocab:], all[len(all)-spec.Vocab:])
			e := moetest.RelErr(all, want)
			t.Logf("%s, %v cache: relative error %.1e", name, c.dt, e)
			require.Less(t, e, c.tol, "%s %v", name, c.dt)
			errs[c.dt] = e
		}
		// fp16 keeps three more bits of each key and value than bf16.
		require.Less(t, errs[kernels.F16], errs[kernels.BF16], name)
	}
}

func mustKV(t *testing.T, m *model.Model, dt kernels.DType) *model.KV {
	kv, err := m.NewKV(8, 8, dt)
	require.NoError(t, err)
	return kv
}

// seqRows is every row of a prefill of n tokens.
func seqRows(n int) []int {
	rows := make([]int, n)
	for i := range rows {
		rows[i] = i
	}
	return rows
}

// sameAsFolder checks a GGUF model's prefill logits: within 1e-4 of the
// float64 reference, within 1e-5 of the same weights loaded from the folder.
func sameAsFolder(t *testing.T, m, folder *model.Model, w *moetest.Whole, ids []int32, name string) {
	t.Helper()
	got, err := m.Prefill(context.Background(), ids)
	require.NoError(t, err)
	fromST, err := folder.Prefill(context.Background(), ids)
	require.NoError(t, err)
	var flat []float64
	for _, row := range w.Logits(ids) {
		flat = append(flat, row...)
	}
	require.Less(t, moetest.RelErr(got, flat), 1e-4, name)
	wide := make([]float64, len(fromST))
	for i, v := range fromST {
		wide[i] = float64(v)
	}
	require.Less(t, moetest.RelErr(got, wide), 1e-5, "%s: the GGUF file and the folder", name)
}
