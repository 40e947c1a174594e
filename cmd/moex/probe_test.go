package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/internal/npy"
)

// TestCarelessFlags: the cases a careless-user probe of the CLI found
// panicking, hanging, exiting 0 with a meaningless result or giving an
// error that does not name the problem; each is now a usage error naming
// the flag or file, given before any work.
func TestCarelessFlags(t *testing.T) {
	model := filepath.Join("..", "..", "testdata", "moe", "mixtral_f32")
	x := filepath.Join(model, "x.npy")
	dir := t.TempDir()
	out := filepath.Join(dir, "y.npy")
	badJSON := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(badJSON, []byte("{"), 0o644))
	wrongKeys := filepath.Join(dir, "keys.json")
	require.NoError(t, os.WriteFile(wrongKeys, []byte(`{"experts": [[0, 1, 2], [3, 4, 5]]}`), 0o644))
	trailing := filepath.Join(dir, "trailing.json")
	require.NoError(t, os.WriteFile(trailing, []byte(`{"kind": "contiguous", "num_experts": 8, "ranks": 2, "slots_per_rank": 4, "replicas": [[0],[0],[0],[0],[1],[1],[1],[1]]}
garbage`), 0o644))
	twoRanks := filepath.Join(dir, "two.json")
	require.NoError(t, os.WriteFile(twoRanks, []byte(`{"kind": "contiguous", "num_experts": 8, "ranks": 2, "slots_per_rank": 4, "replicas": [[0],[0],[0],[0],[1],[1],[1],[1]]}`), 0o644))
	hugeSlots := filepath.Join(dir, "slots.json")
	require.NoError(t, os.WriteFile(hugeSlots, []byte(`{"kind": "contiguous", "num_experts": 8, "ranks": 2, "slots_per_rank": 4000000000000, "replicas": [[0],[0],[0],[0],[1],[1],[1],[1]]}`), 0o644))
	hugeRanks := filepath.Join(dir, "ranks.json")
	require.NoError(t, os.WriteFile(hugeRanks, []byte(`{"kind": "contiguous", "num_experts": 1, "ranks": 1000000000000, "slots_per_rank": 1, "replicas": [[0]]}`), 0o644))
	noKeys := filepath.Join(dir, "nokeys.json")
	require.NoError(t, os.WriteFile(noKeys, []byte(`{"ranks": 2}`), 0o644))
	require.NoError(t, os.Symlink(out, filepath.Join(dir, "link.npy"))) // to a file not made yet
	require.NoError(t, os.WriteFile(filepath.Join(dir, "exists.npy"), nil, 0o644))
	require.NoError(t, os.Link(filepath.Join(dir, "exists.npy"), filepath.Join(dir, "hard.npy")))
	execMoE := []string{"exec", "moe", "--model", model, "--layer", "1", "--input", x, "--out", out}
	with := func(base []string, more ...string) []string { return append(append([]string(nil), base...), more...) }
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"bench ep huge tokens", []string{"bench", "ep", "--ranks", "2", "--tokens", "1000000000000"}, "bench ep: these sizes need about"},
		{"bench ep huge ranks", []string{"bench", "ep", "--ranks", "100000", "--tokens", "16"}, "--ranks 100000 must be in [1, 1024]"},
		{"bench threads", []string{"bench", "grouped-gemm", "--experts", "2", "--tokens-per-expert", "4", "--n", "64", "--k", "64", "--threads", "100000"},
			"--threads 100000 is over the 1024 goroutines"},
		{"bench min-time", []string{"bench", "grouped-gemm", "--experts", "2", "--tokens-per-expert", "4", "--n", "64", "--k", "64", "--min-time", "-1s"},
			"--min-time -1s must not be negative"},
		{"bench moe dtype with model", []string{"bench", "moe", "--model", model, "--layer", "1", "--dtype", "fp8"},
			"--dtype is for --preset's random weights"},
		{"run huge ranks", []string{"run", "--ranks", "10000"}, "--ranks 10000 in-process ranks is over the 1024"},
		{"run huge kv budget", []string{"run", "--kv-budget-gib", "1e12"}, "is over 1048576 GiB"},
		{"exec huge ep", with(execMoE, "--ep", "100000"), "--ep 100000 in-process ranks is over the 1024"},
		{"ids-out is out", with(execMoE, "--ids-out", out), "--out " + out + " and --ids-out " + out + " are the same file"},
		{"ids-out links to out", with(execMoE, "--ids-out", filepath.Join(dir, "link.npy")), "are the same file"},
		{"weights-out a hard link of out", with(execMoE, "--out", filepath.Join(dir, "exists.npy"), "--weights-out", filepath.Join(dir, "hard.npy")), "are the same file"},
		{"output folder missing", with(execMoE, "--weights-out", filepath.Join(dir, "nope", "w.npy")), "the folder " + filepath.Join(dir, "nope") + " does not exist"},
		{"output is a folder", with(execMoE, "--ids-out", dir), "--ids-out " + dir + " is a directory"},
		{"placement unknown with one rank", with(execMoE, "--placement", "foo"), `--placement "foo" (want contiguous`},
		{"placement file broken", with(execMoE, "--ep", "2", "--placement", badJSON), "--placement " + badJSON + ": ep: placement: unexpected EOF"},
		{"placement file wrong keys", with(execMoE, "--ep", "2", "--placement", wrongKeys), `json: unknown field "experts"`},
		{"placement file missing keys", with(execMoE, "--ep", "2", "--placement", noKeys), `"num_experts" is missing or zero`},
		{"placement file with more after it", with(execMoE, "--ep", "2", "--placement", trailing), "more after the placement object"},
		{"placement file of other ranks", with(execMoE, "--placement", twoRanks), "places the experts over 2 ranks, but --ep is 1"},
		{"placement file huge slots", with(execMoE, "--ep", "2", "--placement", hugeSlots), "slots_per_rank 4000000000000 must be in [1, 8 experts]"},
		{"placement file huge ranks", with(execMoE, "--ep", "2", "--placement", hugeRanks), "placement over 1000000000000 ranks: at most 65536"},
		{"layer with a preset", []string{"bench", "mla", "--preset", "deepseek-v2-lite", "--layer", "-5"}, "--layer -5 is for --model"},
		{"bench mla huge", []string{"bench", "mla", "--preset", "deepseek-v2-lite", "--tokens", "1000000000000", "--context", "16"}, "bench mla: these sizes need about"},
		{"bench mla huge context", []string{"bench", "mla", "--preset", "deepseek-v2-lite", "--tokens", "1", "--context", "9223372036854775807"}, "--context 9223372036854775807"},
		{"infinite memory limit", []string{"bench", "grouped-gemm", "--experts", "2", "--tokens-per-expert", "4", "--n", "64", "--k", "64", "--max-memory-gib", "Inf"}, "--max-memory-gib +Inf must be a positive finite number"},
		{"bench ep format", []string{"bench", "ep", "--ranks", "2", "--tokens", "16", "--format", "xml"}, `--format "xml"`},
		{"run steps", []string{"run", "--steps", "1000000000"}, "--steps 1000000000 is over the 1000000"},
		{"out is the input", with(execMoE[:len(execMoE)-1], x), "--out " + x + " is the input --input " + x},
		{"memory limit over the machine", []string{"bench", "grouped-gemm", "--experts", "2", "--tokens-per-expert", "4", "--n", "64", "--k", "64", "--max-memory-gib", "1e308"}, "is over this machine's"},
		{"quantized k not a multiple of the block", []string{"bench", "grouped-gemm", "--experts", "2", "--tokens-per-expert", "4", "--n", "8", "--k", "8", "--dtype", "mxfp4"}, "--n 8 (rows) × --k 8 (columns) in MXFP4"},
		{"redundant without balanced", with(execMoE, "--ep", "2", "--redundant", "3"), "--redundant 3: extra expert slots are for --placement balanced"},
		{"redundant negative", with(execMoE, "--ep", "2", "--placement", "balanced", "--redundant", "-5"), "--redundant -5"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := runCLI(tt.args...)
			require.ErrorContains(t, err, tt.want)
			if !strings.HasPrefix(tt.name, "placement file") { // a file's error, not the flags'
				require.ErrorIs(t, err, errUsage)
			}
			_, statErr := os.Stat(out)
			require.True(t, os.IsNotExist(statErr), "nothing written")
		})
	}

	// --deadline named when it ends the job.
	_, _, err := runCLI(with(execMoE, "--deadline", "1ns")...)
	require.ErrorContains(t, err, "--deadline 1ns passed before the job finished")

	// bench ep with no tokens: no ratio against a memcpy of nothing.
	stdout, _, err := runCLI("bench", "ep", "--ranks", "2", "--tokens", "0", "--min-time", "1ms", "--max-runs", "2")
	require.NoError(t, err)
	require.Contains(t, stdout, " -")
	require.NotContains(t, stdout, "0.01×")

	// bench mla on a model without MLA says so.
	_, _, err = runCLI("bench", "mla", "--model", model, "--layer", "1", "--tokens", "1", "--context", "16")
	require.ErrorContains(t, err, `(model_type "mixtral") has no kv_lora_rank`)
}

// smallWhole is a small whole deepseek_v2 model (BF16, two layers, the
// first dense) of vocab ids.
func smallWhole(vocab int) moetest.WholeSpec {
	return moetest.WholeSpec{
		MoE: moetest.Spec{ModelType: "deepseek_v2", Experts: 6, TopK: 2, Inter: 12, SharedExperts: 1, Method: "greedy",
			Scoring: "softmax", NGroup: 1, TopKGroup: 1, DType: "BF16"},
		Attn:   moetest.AttnSpec{Heads: 2, KVLoraRank: 12, Nope: 8, Rope: 4, VDim: 8, Theta: 10000},
		Hidden: 24, Layers: 2, FirstKDense: 1, Vocab: vocab, DenseInter: 20, Seed: 9,
	}
}

// TestExecLogits: a whole model's prefill from the shell, against the
// float64 reference (within 1e-4, the same argmax at every position), and
// its bad input.
func TestExecLogits(t *testing.T) {
	spec := smallWhole(30)
	w, err := moetest.GenerateWhole(spec)
	require.NoError(t, err)
	dir := t.TempDir()
	ckpt := filepath.Join(dir, "ckpt")
	require.NoError(t, w.WriteTo(ckpt))
	ids := moetest.Tokens(4, 11, spec.Vocab)
	idsPath, out := filepath.Join(dir, "ids.npy"), filepath.Join(dir, "logits.npy")
	require.NoError(t, npy.WriteInt32(idsPath, []int{len(ids)}, ids))
	_, _, err = runCLI("exec", "logits", "--model", ckpt, "--input-ids", idsPath, "--out", out)
	require.NoError(t, err)
	got, err := npy.ReadFloat32(out)
	require.NoError(t, err)
	require.Equal(t, []int{len(ids), spec.Vocab}, got.Shape)
	want := w.Logits(ids)
	var flat []float64
	for p, row := range want {
		flat = append(flat, row...)
		best, bestGot := 0, 0
		for v := range row {
			if row[v] > row[best] {
				best = v
			}
			if got.Data[p*spec.Vocab+v] > got.Data[p*spec.Vocab+bestGot] {
				bestGot = v
			}
		}
		require.Equal(t, best, bestGot, "argmax at position %d", p)
	}
	require.Less(t, moetest.RelErr(got.Data, flat), 1e-4)
	// bf16 and fp16 KV caches: the same model, its keys and values
	// rounded (fp16 three bits finer).
	var errs []float64
	for _, kv := range []string{"bf16", "f16"} {
		_, _, err = runCLI("exec", "logits", "--model", ckpt, "--input-ids", idsPath, "--out", out, "--kv", kv)
		require.NoError(t, err)
		got, err = npy.ReadFloat32(out)
		require.NoError(t, err)
		e := moetest.RelErr(got.Data, flat)
		require.Greater(t, e, 1e-8, "a %s cache changed nothing", kv)
		require.Less(t, e, 1e-2, kv)
		errs = append(errs, e)
	}
	require.Less(t, errs[1], errs[0], "fp16's error against bf16's")
	_, _, err = runCLI("exec", "logits", "--model", ckpt, "--input-ids", idsPath, "--out", out, "--kv", "f8")
	require.ErrorContains(t, err, `exec logits: --kv "f8" (want f32, bf16 or f16)`)
	_, _, err = runCLI("exec", "logits", "--model", ckpt, "--input-ids", idsPath, "--out", out, "--numerics", "fast")
	require.ErrorContains(t, err, `exec logits: kernels: numerics "fast": want exact, int8dot or bf16dot`)
	_, _, err = runCLI("exec", "logits", "--model", ckpt, "--input-ids", idsPath, "--out", out, "--numerics", "int8dot")
	require.ErrorContains(t, err, "int8dot numerics need UINT4, INT8, MXFP4 or INT4 weights, have BF16")

	bad := filepath.Join(dir, "bad.npy")
	require.NoError(t, npy.WriteInt32(bad, []int{2}, []int32{3, 30}))
	_, _, err = runCLI("exec", "logits", "--model", ckpt, "--input-ids", bad, "--out", out)
	require.ErrorContains(t, err, bad+": model: token 1 is id 30, outside the vocabulary [0, 30)")
	twoD := filepath.Join(dir, "2d.npy")
	require.NoError(t, npy.WriteInt32(twoD, []int{1, 2}, []int32{3, 4}))
	_, _, err = runCLI("exec", "logits", "--model", ckpt, "--input-ids", twoD, "--out", out)
	require.ErrorContains(t, err, "shape [1 2], want [tokens]")
	_, _, err = runCLI("exec", "logits", "--model", ckpt, "--input-ids", idsPath, "--out", idsPath)
	require.ErrorContains(t, err, "--out "+idsPath+" is the input --input-ids "+idsPath)
	_, _, err = runCLI("exec", "logits", "--model", filepath.Join("..", "..", "testdata", "moe", "qwen3_next_bf16"), "--input-ids", idsPath, "--out", out)
	require.ErrorContains(t, err, "moex runs its MoE block, not yet its whole model: three of its four layers attend by gated DeltaNet")
	_, _, err = runCLI("exec", "logits", "--model", filepath.Join("..", "..", "testdata", "moe", "mixtral_f32"), "--input-ids", idsPath, "--out", out)
	require.ErrorContains(t, err, "vocab_size is missing", "a MoE block's checkpoint is no whole model")
}

// TestRunLargeSeed: any uint64 seed runs (the schedule took int(seed), which
// wrapped negative past 2^63).
func TestRunLargeSeed(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "moe", "deepseek_v2_f32")
	for _, seed := range []string{"9223372036854775808", "18446744073709551615"} {
		out, _, err := runCLI("run", "--model", dir, "--layer", "1", "--ranks", "2", "--steps", "2", "--seed", seed)
		require.NoError(t, err, "--seed %s", seed)
		require.Contains(t, out, ": ok")
	}
}

// TestExecLogitsGGUF: exec logits on a GGUF file (a Qwen3-MoE as llama.cpp's
// converter writes it) gives the float64 reference's logits.
func TestExecLogitsGGUF(t *testing.T) {
	w, _, path := qwen3Whole(t, 31, 20, "F32")
	dir := t.TempDir()
	ids := moetest.Tokens(5, 9, 20)
	idsPath, out := filepath.Join(dir, "ids.npy"), filepath.Join(dir, "logits.npy")
	require.NoError(t, npy.WriteInt32(idsPath, []int{len(ids)}, ids))
	_, _, err := runCLI("exec", "logits", "--model", path, "--input-ids", idsPath, "--out", out)
	require.NoError(t, err)
	got, err := npy.ReadFloat32(out)
	require.NoError(t, err)
	var flat []float64
	for _, row := range w.Logits(ids) {
		flat = append(flat, row...)
	}
	require.Less(t, moetest.RelErr(got.Data, flat), 1e-4)
}

// TestBenchModel: bench model on a preset and on a GGUF file prints a pp
// and a tg case, the tg case with the bytes a step reads; bad flags are
// usage errors. (What it measures is not asserted: it times the machine.)
func TestBenchModel(t *testing.T) {
	out, _, err := runCLI("bench", "model", "--preset", "tiny", "-p", "8", "-n", "4", "--rounds", "1", "--min-time", "0", "--format", "json")
	require.NoError(t, err)
	var rows []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		rows = append(rows, r)
	}
	require.Len(t, rows, 2)
	require.Equal(t, "pp8", rows[0]["case"])
	require.Equal(t, "tg4", rows[1]["case"])
	require.Greater(t, rows[1]["bytes"], 0.0)
	require.Greater(t, rows[0]["tokens_per_s"], 0.0)
	for _, r := range rows { // the parts of a token's time: each there, within the whole
		parts := r["attention_ns"].(float64) + r["mlp_ns"].(float64) + r["head_ns"].(float64)
		for _, k := range []string{"attention_ns", "mlp_ns", "head_ns"} {
			require.Greater(t, r[k], 0.0, "%s %s", r["case"], k)
		}
		if r["case"] == "tg4" {
			require.LessOrEqual(t, parts, r["median_ns"].(float64), "one round: a step's parts within the step")
		}
	}

	// Three sequences decoded together: the batch reported, no bytes of
	// one token's step.
	out, _, err = runCLI("bench", "model", "--preset", "tiny", "-p", "5", "-n", "2", "--rounds", "1", "--batch", "3", "--format", "json")
	require.NoError(t, err)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		require.Equal(t, 3.0, r["batch"], line)
		require.NotContains(t, r, "bytes", line)
		require.Greater(t, r["tokens_per_s"], 0.0, line)
	}

	_, _, path := qwen3Whole(t, 32, 20, "F32")
	out, _, err = runCLI("bench", "model", "--model", path, "-p", "6", "-n", "3", "--rounds", "1")
	require.NoError(t, err)
	require.Contains(t, out, "pp6")
	require.Contains(t, out, "tg3")
	require.Regexp(t, `tg3, a token on average: attention \d+\.\d\d ms, MLP \d+\.\d\d ms, output \d+\.\d\d ms`, out)

	for _, bad := range []struct {
		args []string
		err  string
	}{
		{[]string{"--preset", "tiny", "--model", path}, "give --model or --preset"},
		{[]string{"--preset", "llama"}, `unknown --preset "llama"`},
		{[]string{"--preset", "tiny", "--layers", "9"}, "--layers 9 (the preset has 3)"},
		{[]string{"--model", path, "--dtype", "q8_0"}, "--dtype is for --preset"},
		{[]string{"--preset", "tiny", "-p", "0", "-n", "0"}, "want tokens to time"},
		{[]string{"--preset", "tiny", "--kv", "fp8"}, `--kv "fp8"`},
		{[]string{"--preset", "tiny", "--dtype", "q2_k"}, `dtype "q2_k"`},
		{[]string{"--preset", "tiny", "--batch", "0"}, "--batch 0: want 1 to 256 sequences"},
	} {
		_, _, err := runCLI(append([]string{"bench", "model"}, bad.args...)...)
		require.ErrorIs(t, err, errUsage, "%v", bad.args)
		require.ErrorContains(t, err, bad.err)
	}
}

// TestRunWhole: moex run --whole on a whole model's folder (and its GGUF
// file) runs every rank's requests and passes its parity check in both MoE
// modes; the flags it cannot take are usage errors.
func TestRunWhole(t *testing.T) {
	_, dir, path := qwen3Whole(t, 34, 24, "BF16")
	for _, c := range []struct{ model, mode, want string }{
		{dir, "alltoall", "bit-identical true"}, {dir, "gather", "within 1e-6"}, {path, "alltoall", "bit-identical true"},
	} {
		out, _, err := runCLI("run", "--whole", "--model", c.model, "--ranks", "2", "--batch", "2", "--context", "5", "--steps", "3", "--moe-mode", c.mode)
		require.NoError(t, err, out)
		require.Contains(t, out, "2 ranks × 2 requests of 5 prompt tokens, 3 decode steps")
		require.Contains(t, out, c.want)
		require.Contains(t, out, ": ok")
		require.Contains(t, out, "KV cache: 64 B a token over 2 layers")
	}
	for _, bad := range []struct {
		args []string
		err  string
	}{
		{[]string{"--whole"}, "--whole needs --model"},
		{[]string{"--whole", "--model", dir, "--attn", "tp"}, "--whole runs DP attention"},
		{[]string{"--whole", "--model", dir, "--layer", "1"}, "--whole runs DP attention"},
	} {
		_, _, err := runCLI(append([]string{"run"}, bad.args...)...)
		require.ErrorIs(t, err, errUsage)
		require.ErrorContains(t, err, bad.err)
	}
}

// qwen3Whole is a small Qwen3-MoE whole model for the CLI's tests (vocab
// of vocab, experts in dtype): the generated model, its checkpoint folder,
// and its GGUF file as llama.cpp's converter writes it.
func qwen3Whole(t *testing.T, seed uint64, vocab int, dtype string) (w *moetest.Whole, dir, gguf string) {
	t.Helper()
	spec := moetest.WholeSpec{
		MoE:    moetest.Spec{ModelType: "qwen3_moe", Experts: 4, TopK: 2, Inter: 8, NormTopK: true, DType: dtype},
		GQA:    &moetest.GQASpec{Heads: 2, KVHeads: 1, HeadDim: 8, QKNorm: "head", Theta: 1e6},
		Hidden: 16, Layers: 2, Vocab: vocab, DenseInter: 1, Seed: seed,
	}
	w, err := moetest.GenerateWhole(spec)
	require.NoError(t, err)
	dir = t.TempDir()
	require.NoError(t, w.WriteTo(dir))
	data, err := w.GGUF("qwen3moe")
	require.NoError(t, err)
	gguf = filepath.Join(t.TempDir(), "qwen3.gguf")
	require.NoError(t, os.WriteFile(gguf, data, 0o644))
	return w, dir, gguf
}

// TestArgmax: bench model's greedy choice is the first place of the
// largest logit, ties, signed zeros, lengths off the SIMD width and
// non-finite logits included (a NaN is passed over; +Inf wins).
func TestArgmax(t *testing.T) {
	neg0 := float32(math.Copysign(0, -1))
	for _, c := range []struct {
		v    []float32
		want int32
	}{
		{[]float32{3}, 0},
		{[]float32{1, 5, 2, 5}, 1},
		{[]float32{-3, -1, -2}, 1},
		{[]float32{neg0, 0, -1}, 0},
		{[]float32{float32(math.NaN()), 2, 7, 1}, 2},
		{[]float32{1, float32(math.Inf(1)), 9}, 1},
		{nil, 0},
	} {
		assert.Equal(t, c.want, argmax(c.v), "%v", c.v)
	}
	v := make([]float32, 151936)
	for i := range v {
		v[i] = float32(math.Sin(float64(i)))
	}
	want := 0
	for i, x := range v {
		if x > v[want] {
			want = i
		}
	}
	assert.Equal(t, int32(want), argmax(v))
	v[77777], v[150000] = 2, 2
	assert.Equal(t, int32(77777), argmax(v))
}
