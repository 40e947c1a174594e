package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/sim"
)

// TestSim: moex sim's table, its JSON, a sweep with a plot, and its
// named errors.
func TestSim(t *testing.T) {
	out, _, err := runCLI("sim", "--preset", "deepseek-coder-v2", "--hardware", "h100", "--ranks", "8", "--input", "1", "--output", "512",
		"--max-batch", "1536", "--stages")
	require.NoError(t, err)
	for _, want := range []string{"deepseek-coder-v2 (236B parameters", "tp", "dp-gather", "dp-ep", "1138", "MLA", "FlashMLA"} {
		require.Contains(t, out, want)
	}

	out, _, err = runCLI("sim", "--preset", "deepseek-v3", "--hardware", "h200", "--ranks", "64", "--layout", "dp-ep", "--format", "json")
	require.NoError(t, err)
	var doc struct {
		Model  sim.Model
		Points []sim.Point
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Equal(t, 61, doc.Model.Layers)
	require.Len(t, doc.Points, 1)
	require.NotNil(t, doc.Points[0].Result)
	require.Equal(t, doc.Points[0].Result.MaxBatch, doc.Points[0].Result.Batch)

	plot := filepath.Join(t.TempDir(), "tput.svg")
	out, _, err = runCLI("sim", "--preset", "deepseek-v2", "--ranks", "8", "--sweep", "batch", "--plot", plot)
	require.NoError(t, err)
	require.Contains(t, out, "plot: "+plot)
	data, err := os.ReadFile(plot)
	require.NoError(t, err)
	require.True(t, strings.Contains(string(data), "<svg"))

	out, _, err = runCLI("sim", "--phase", "prefill", "--ranks", "8", "--input", "4096", "--batch", "8", "--layout", "dp-ep")
	require.NoError(t, err)
	require.Contains(t, out, "prefill ms")
	require.Contains(t, out, "prompt tokens/s")

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--phase", "train"}, `--phase "train"`},
		{[]string{"--hardware", "tpu"}, `unknown hardware preset "tpu"`},
		{[]string{"--preset", "llama"}, `unknown model preset "llama"`},
		{[]string{"--ranks", "0"}, "0 ranks"},
		{[]string{"--layout", "tp,ring"}, `unknown layout "ring"`},
		{[]string{"--kv-budget-gib", "0.0001"}, "holds none"},
		{[]string{"--batch", "100000", "--hardware", "h200"}, "does not fit"},
		{[]string{"--hardware", "h100"}, "the weights take 84.7 GB a rank"},
		{[]string{"--plot", "x.svg"}, "--plot needs --sweep"},
		{[]string{"--sweep", "ranks"}, "--sweep ranks needs --values"},
		{[]string{"--sweep", "heads"}, `unknown sweep axis "heads"`},
		{[]string{"--format", "yaml"}, `--format "yaml"`},
		{[]string{"--weight-dtype", "int2"}, `unknown dtype "int2"`},
		{[]string{"--model", filepath.Join("..", "..", "testdata", "moe", "mixtral_f32")}, "heads is 0, must be positive"}, // a MoE block's config: no attention
	} {
		_, _, err := runCLI(append([]string{"sim", "--layout", "tp"}, tt.args...)...)
		if tt.args[0] == "--layout" {
			_, _, err = runCLI(append([]string{"sim"}, tt.args...)...)
		}
		require.ErrorContains(t, err, tt.want, "%v", tt.args)
	}
}
