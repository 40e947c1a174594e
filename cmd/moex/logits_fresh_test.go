package main

import (
	"cmp"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/internal/npy"
)

// TestExecLogitsFresh: `moex exec logits` on whole models it has never
// seen: each family's checkpoint folder, and its GGUF file as llama.cpp's
// converter writes it, made from a seed drawn at each run (MOEX_SEED=N
// repeats one; the seed is logged), against the float64 reference written
// from the family's modeling file (llama.cpp's graph for the GGUF):
// within 1e-4 relative error, and the same argmax at every position where
// the reference's best two logits are further apart than that error could
// carry them.
func TestExecLogitsFresh(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("MOEX_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "MOEX_SEED")
	}
	t.Logf("seed %d (MOEX_SEED=%d repeats this run)", seed, seed)
	specs := moetest.GQAFamilies()
	specs["deepseek_v2_bf16"] = smallWhole(30)
	names := make([]string, 0, len(specs))
	for name := range specs {
		names = append(names, name)
	}
	slices.Sort(names)
	for i, name := range names {
		spec := specs[name]
		spec.Seed = seed + uint64(i)
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			ids := moetest.Tokens(seed+100+uint64(i), 12, spec.Vocab)
			idsPath := filepath.Join(dir, "ids.npy")
			require.NoError(t, npy.WriteInt32(idsPath, []int{len(ids)}, ids))
			check := func(w *moetest.Whole, model, what string) {
				out := filepath.Join(dir, "logits.npy")
				_, _, err := runCLI("exec", "logits", "--model", model, "--input-ids", idsPath, "--out", out)
				require.NoError(t, err, what)
				got, err := npy.ReadFloat32(out)
				require.NoError(t, err)
				require.Equal(t, []int{len(ids), spec.Vocab}, got.Shape)
				want := w.Logits(ids)
				var flat []float64
				for _, row := range want {
					flat = append(flat, row...)
				}
				e := moetest.RelErr(got.Data, flat)
				require.Less(t, e, 1e-4, "%s: relative error", what)
				scale := 0.0
				for _, x := range flat {
					scale = math.Max(scale, math.Abs(x))
				}
				for p, row := range want {
					order := make([]int, len(row))
					for v := range order {
						order[v] = v
					}
					slices.SortFunc(order, func(a, b int) int { return cmp.Compare(row[b], row[a]) })
					if row[order[0]]-row[order[1]] <= 2e-4*scale {
						continue // a near-tie the tolerance cannot order
					}
					gotRow := got.Data[p*spec.Vocab:][:spec.Vocab]
					best := 0
					for v, x := range gotRow {
						if x > gotRow[best] {
							best = v
						}
					}
					require.Equal(t, order[0], best, "%s: argmax at position %d", what, p)
				}
			}
			w, err := moetest.GenerateWhole(spec)
			require.NoError(t, err)
			folder := filepath.Join(dir, "ckpt")
			require.NoError(t, w.WriteTo(folder))
			check(w, folder, "the folder")

			arch, ok := moetest.GGUFArch[name]
			split := false
			if spec.GQA == nil {
				arch, ok, split = "deepseek2", true, seed%2 == 1 // kv_b whole or split per head, as the seed falls
			}
			require.True(t, ok, "no GGUF architecture for %s", name)
			gspec := moetest.ForGGUF(spec, arch)
			if arch == "deepseek2" {
				gspec.FirstKDense = spec.FirstKDense // llama.cpp's deepseek2 has leading dense layers
			}
			gw, err := moetest.GenerateWhole(gspec)
			require.NoError(t, err)
			data, err := gw.GGUFSplit(arch, split)
			require.NoError(t, err)
			path := filepath.Join(dir, "model.gguf")
			require.NoError(t, os.WriteFile(path, data, 0o644))
			check(gw, path, "the GGUF file ("+arch+")")
		})
	}
}
