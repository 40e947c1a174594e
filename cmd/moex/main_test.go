package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/internal/npy"
)

func runCLI(args ...string) (string, string, error) {
	var out, errb bytes.Buffer
	err := run(args, &out, &errb)
	return out.String(), errb.String(), err
}

// TestExecMoEGolden runs `exec moe` on every stored case and compares with
// the stored float64 reference.
func TestExecMoEGolden(t *testing.T) {
	root := filepath.Join("..", "..", "testdata", "moe")
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	for _, e := range entries {
		t.Run(e.Name(), func(t *testing.T) {
			dir := filepath.Join(root, e.Name())
			layer, err := os.ReadFile(filepath.Join(dir, "layer"))
			require.NoError(t, err)
			tmp := t.TempDir()
			y, ids, w := filepath.Join(tmp, "y.npy"), filepath.Join(tmp, "ids.npy"), filepath.Join(tmp, "w.npy")
			args := []string{"exec", "moe", "--model", dir, "--layer", string(layer), "--input", filepath.Join(dir, "x.npy"),
				"--out", y, "--ids-out", ids, "--weights-out", w}
			if tp := filepath.Join(dir, "tokens.npy"); fileExists(tp) {
				args = append(args, "--tokens", tp)
			}
			_, _, err = runCLI(args...)
			require.NoError(t, err)
			compareNpy(t, filepath.Join(dir, "y.npy"), y, 1e-5)
			compareNpy(t, filepath.Join(dir, "w.npy"), w, 1e-6)
			wantIDs, err := npy.ReadInt32(filepath.Join(dir, "ids.npy"))
			require.NoError(t, err)
			gotIDs, err := npy.ReadInt32(ids)
			require.NoError(t, err)
			require.Equal(t, wantIDs.Shape, gotIDs.Shape)
			require.Equal(t, wantIDs.Data, gotIDs.Data)
		})
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func compareNpy(t *testing.T, wantPath, gotPath string, tol float64) {
	t.Helper()
	want, err := npy.ReadFloat32(wantPath)
	require.NoError(t, err)
	got, err := npy.ReadFloat32(gotPath)
	require.NoError(t, err)
	require.Equal(t, want.Shape, got.Shape)
	ref := make([]float64, len(want.Data))
	for i, v := range want.Data {
		ref[i] = float64(v)
	}
	require.LessOrEqual(t, moetest.RelErr(got.Data, ref), tol)
}

// TestExecMoEFreshCheckpoint: a checkpoint generated here, with sizes and a
// seed no stored case has, against the float64 reference.
func TestExecMoEFreshCheckpoint(t *testing.T) {
	spec := moetest.Spec{ModelType: "deepseek_v3", Hidden: 44, Experts: 24, TopK: 6, Inter: 18, SharedExperts: 2,
		Method: "noaux_tc", Scoring: "sigmoid", NGroup: 6, TopKGroup: 3, NormTopK: true, Scaling: 2.5,
		NumLayers: 5, Layer: 4, FirstKDense: 3, DType: "BF16", Shards: 3, Seed: 4242}
	dir, xp, yp, ip := execFresh(t, spec, 23)

	// Zero tokens: shapes kept.
	require.NoError(t, npy.WriteFloat32(xp, []int{0, spec.Hidden}, nil))
	_, _, err := runCLI("exec", "moe", "--model", dir, "--layer", "4", "--input", xp, "--out", yp, "--ids-out", ip)
	require.NoError(t, err)
	y, err := npy.ReadFloat32(yp)
	require.NoError(t, err)
	require.Equal(t, []int{0, spec.Hidden}, y.Shape)
	ids, err := npy.ReadInt32(ip)
	require.NoError(t, err)
	require.Equal(t, []int{0, 6}, ids.Shape)
}

// TestExecMoEFreshGptOss: gpt-oss checkpoints, MXFP4 as released and
// dense bf16, with sizes and seeds no stored case has.
func TestExecMoEFreshGptOss(t *testing.T) {
	execFresh(t, moetest.Spec{ModelType: "gpt_oss", Hidden: 96, Experts: 12, TopK: 4, Inter: 64,
		NumLayers: 3, Layer: 2, DType: "MXFP4", Shards: 2, Seed: 4343}, 19)
	execFresh(t, moetest.Spec{ModelType: "gpt_oss", Hidden: 40, Experts: 10, TopK: 3, Inter: 28,
		NumLayers: 2, Layer: 0, DType: "BF16", SwigluLimit: 6, Seed: 4444}, 11)
}

// execFresh writes spec's checkpoint and T random tokens, runs moex exec
// moe on them and checks its output and expert ids against the float64
// reference; it returns the folder and the paths of x, y and ids.
func execFresh(t *testing.T, spec moetest.Spec, T int) (dir, xp, yp, ip string) {
	t.Helper()
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	dir = t.TempDir()
	require.NoError(t, m.WriteTo(dir))
	x := moetest.Input(77, T, spec.Hidden, false)
	xp, yp, ip = filepath.Join(dir, "x.npy"), filepath.Join(dir, "y.npy"), filepath.Join(dir, "ids.npy")
	require.NoError(t, npy.WriteFloat32(xp, []int{T, spec.Hidden}, x))
	args := []string{"exec", "moe", "--model", dir, "--layer", fmt.Sprint(spec.Layer), "--input", xp, "--out", yp, "--ids-out", ip}
	var tokens []int32
	if spec.Hash() {
		tokens = moetest.Tokens(78, T, spec.Vocab)
		tp := filepath.Join(dir, "tokens.npy")
		require.NoError(t, npy.WriteInt32(tp, []int{T}, tokens))
		args = append(args, "--tokens", tp)
	}
	_, _, err = runCLI(args...)
	require.NoError(t, err)
	requireOutputs(t, yp, ip, m.ForwardTokens(x, tokens))
	return dir, xp, yp, ip
}

// requireOutputs: exec moe's y.npy within 1e-5 of ref and its ids.npy
// ref's experts.
func requireOutputs(t *testing.T, yp, ip string, ref moetest.Result) {
	t.Helper()
	y, err := npy.ReadFloat32(yp)
	require.NoError(t, err)
	require.LessOrEqual(t, moetest.RelErr(y.Data, ref.Y), 1e-5)
	ids, err := npy.ReadInt32(ip)
	require.NoError(t, err)
	require.Equal(t, ref.IDs, ids.Data)
}

func TestExecMoEErrors(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "moe", "mixtral_f32")
	tmp := t.TempDir()
	x := filepath.Join(dir, "x.npy")
	out := filepath.Join(tmp, "y.npy")
	write := func(name string, shape []int, data []float32) string {
		p := filepath.Join(tmp, name)
		require.NoError(t, npy.WriteFloat32(p, shape, data))
		return p
	}
	nan := make([]float32, 3*32)
	nan[2*32+7] = float32(math.NaN())
	tests := []struct {
		name  string
		args  []string
		err   string
		usage bool
	}{
		{"missing --model", []string{"--layer", "1", "--input", x, "--out", out}, "--model is required", true},
		{"missing --layer", []string{"--model", dir, "--input", x, "--out", out}, "--layer is required", true},
		{"unknown flag", []string{"--model", dir, "--layer", "1", "--input", x, "--out", out, "--bogus"}, "flag provided but not defined: -bogus", true},
		{"wrong hidden", []string{"--model", dir, "--layer", "1", "--input", write("a.npy", []int{2, 31}, make([]float32, 62)), "--out", out}, "shape [2 31], want [tokens, 32]", false},
		{"one-dimensional", []string{"--model", dir, "--layer", "1", "--input", write("b.npy", []int{32}, make([]float32, 32)), "--out", out}, "shape [32], want [tokens, 32]", false},
		{"non-finite", []string{"--model", dir, "--layer", "1", "--input", write("c.npy", []int{3, 32}, nan), "--out", out}, "input token 2 has a non-finite value NaN at column 7", false},
		{"dense layer", []string{"--model", dir, "--layer", "5", "--input", x, "--out", out}, "layer 5 out of range: the model has 2 layers", false},
		{"missing input", []string{"--model", dir, "--layer", "1", "--input", filepath.Join(tmp, "none.npy"), "--out", out}, "no such file", false},
		{"no model", []string{"--model", tmp, "--layer", "1", "--input", x, "--out", out}, "config.json: no such file", false},
		{"zero timeout", []string{"--model", dir, "--layer", "1", "--input", x, "--out", out, "--timeout", "0s"}, "--timeout 0s must be positive", true},
		{"negative deadline", []string{"--model", dir, "--layer", "1", "--input", x, "--out", out, "--deadline", "-2s"}, "--deadline -2s must be positive (or 0: no limit)", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := runCLI(append([]string{"exec", "moe"}, tt.args...)...)
			require.ErrorContains(t, err, tt.err)
			require.Equal(t, tt.usage, strings.Contains(err.Error(), "usage"), err.Error())
		})
	}
	_, _, err := runCLI("exec", "mlp")
	require.ErrorContains(t, err, `unknown block "mlp"`)
	_, _, err = runCLI("frobnicate")
	require.ErrorContains(t, err, `unknown command "frobnicate"`)
}

// TestBinaryExitStatus builds moex and checks the process contract: exit 0
// on success, non-zero with one line on stderr otherwise.
func TestBinaryExitStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "moex")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, string(out))

	dir := filepath.Join("..", "..", "testdata", "moe", "qwen3_moe_f32")
	y := filepath.Join(t.TempDir(), "y.npy")
	cmd := exec.Command(bin, "exec", "moe", "--model", dir, "--layer", "2", "--input", filepath.Join(dir, "x.npy"), "--out", y)
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Empty(t, out)

	cmd = exec.Command(bin, "exec", "moe", "--model", dir, "--layer", "0", "--input", filepath.Join(dir, "x.npy"), "--out", y)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr)
	require.Equal(t, 1, exitErr.ExitCode())
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	require.Len(t, lines, 1, stderr.String())
	require.Contains(t, lines[0], "moex: ")

	// Malformed .npy inputs that once panicked the reader: one line naming
	// the problem, exit 1, from the process itself.
	bad := map[string]string{
		"cut.npy":      "\x93NUMPY\x01\x00\x76\x00{'descr': '<f4', 'fo",
		"zero.npy":     "\x93NUMPY\x01\x00\x00\x00",
		"unclosed.npy": "\x93NUMPY\x01\x00\x34\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2,\n",
	}
	want := map[string]string{"cut.npy": "the header says 118 bytes", "zero.npy": "dict is empty", "unclosed.npy": "unclosed 'shape'"}
	for name, raw := range bad {
		in := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(in, []byte(raw), 0o644))
		cmd = exec.Command(bin, "exec", "moe", "--model", dir, "--layer", "2", "--input", in, "--out", y)
		stderr.Reset()
		cmd.Stderr = &stderr
		err = cmd.Run()
		require.ErrorAs(t, err, &exitErr, name)
		require.Equal(t, 1, exitErr.ExitCode(), stderr.String())
		lines = strings.Split(strings.TrimSpace(stderr.String()), "\n")
		require.Len(t, lines, 1, stderr.String())
		require.Contains(t, lines[0], want[name])
	}
}

func TestInfo(t *testing.T) {
	out, _, err := runCLI("info")
	require.NoError(t, err)
	require.Contains(t, out, "simd")
}

// TestBenchRunsOnce runs each benchmark once on small shapes, so that none
// can rot, and checks the JSON fields.
func TestBenchRunsOnce(t *testing.T) {
	out, _, err := runCLI("bench", "grouped-gemm", "--experts", "3", "--tokens-per-expert", "0,1,5", "--n", "20", "--k", "37",
		"--dtype", "f32,bf16,f16", "--impl", "generic,auto", "--threads", "1,2", "--min-time", "0", "--max-runs", "1", "--format", "json")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3*3*2*2)
	for _, line := range lines {
		var r benchResult
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		require.Equal(t, "grouped-gemm", r.Bench)
		require.Positive(t, r.MedianNS)
		require.Positive(t, r.ProbeGBPS)
		require.NotEmpty(t, r.Impl)
		require.GreaterOrEqual(t, r.GFLOPS, 0.0)
		require.Equal(t, "f32", r.SpeedupVs, "each case against the first dtype's")
		require.Positive(t, r.Speedup)
		if r.Dtype == "f32" {
			require.Equal(t, 1.0, r.Speedup)
		}
	}
	dir := filepath.Join("..", "..", "testdata", "moe", "deepseek_v3_f32")
	out, _, err = runCLI("bench", "moe", "--model", dir, "--layer", "0", "--tokens", "1,3", "--min-time", "0", "--max-runs", "1")
	require.NoError(t, err)
	require.Contains(t, out, "T=3")
	require.Contains(t, out, "memory read-bandwidth probe")
	// A hash layer is timed on random token ids.
	dir = filepath.Join("..", "..", "testdata", "moe", "deepseek_v4_bf16_hash")
	out, _, err = runCLI("bench", "moe", "--model", dir, "--layer", "1", "--tokens", "2", "--min-time", "0", "--max-runs", "1")
	require.NoError(t, err)
	require.Contains(t, out, "T=2")

	out, _, err = runCLI("bench", "mla", "--preset", "deepseek-v2-lite", "--tokens", "1,2", "--context", "0,70", "--min-time", "0",
		"--max-runs", "2", "--format", "json")
	require.NoError(t, err)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4)
	for _, line := range lines {
		var r benchResult
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		require.Equal(t, "mla", r.Bench)
		require.Positive(t, r.GFLOPS)
		require.Positive(t, r.Bytes)
	}
	_, _, err = runCLI("bench", "mla", "--min-time", "0")
	require.ErrorContains(t, err, "bench mla: --model DIR or --preset deepseek-v2-lite is required")
	_, _, err = runCLI("bench", "mla", "--preset", "deepseek-v2-lite", "--tokens", "0")
	require.ErrorContains(t, err, "--tokens must be positive")
	_, _, err = runCLI("bench", "mla", "--preset", "gpt-oss-20b", "--tokens", "1")
	require.ErrorContains(t, err, `bench mla: unknown --preset "gpt-oss-20b" (have deepseek-v2-lite)`)
	_, _, err = runCLI("bench", "moe", "--preset", "gpt-oss", "--tokens", "1")
	require.ErrorContains(t, err, `bench moe: unknown --preset "gpt-oss" (have deepseek-v2-lite, gpt-oss-20b)`)

	out, _, err = runCLI("bench", "ep", "--ranks", "1,3", "--tokens", "0,2", "--min-time", "0", "--max-runs", "1", "--format", "json")
	require.NoError(t, err)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 4)
	require.Contains(t, out, `"speed_vs_memcpy"`)

	out, _, err = runCLI("bench", "grouped-gemm", "--layout", "rows", "--n", "4", "--k", "4", "--tokens-per-expert", "2", "--min-time", "0", "--max-runs", "1")
	require.NoError(t, err)
	require.Regexp(t, `K=4 rows +f32`, out)
	require.NotContains(t, out, "vs ", "one dtype: no ratio column")
	// The numerics modes: each dtype in the modes it has, bf16dot beside
	// the vdpbf16ps peak where the machine has it.
	out, _, err = runCLI("bench", "grouped-gemm", "--n", "32", "--k", "64", "--tokens-per-expert", "3", "--dtype", "bf16,int8,f32",
		"--numerics", "exact,int8dot,bf16dot", "--min-time", "0", "--max-runs", "1")
	require.NoError(t, err)
	for _, d := range []string{" bf16 ", " bf16+bf16dot ", " int8 ", " int8+int8dot ", " f32 "} {
		require.Contains(t, out, d)
	}
	require.NotContains(t, out, "f32+")
	_, _, err = runCLI("bench", "grouped-gemm", "--numerics", "fast")
	require.ErrorContains(t, err, `numerics "fast": want exact, int8dot or bf16dot`)
	_, _, err = runCLI("bench", "grouped-gemm", "--layout", "rows", "--numerics", "bf16dot")
	require.ErrorContains(t, err, "--numerics other than exact pack their weights")
	// Sizes past the machine's memory are refused before they are allocated;
	// no tokens read nothing, so no bandwidth is claimed.
	_, _, err = runCLI("bench", "moe", "--preset", "deepseek-v2-lite", "--tokens", "99999999999", "--min-time", "0")
	require.ErrorContains(t, err, "bench moe: these sizes need about")
	require.ErrorContains(t, err, "over --max-memory-gib")
	_, _, err = runCLI("bench", "grouped-gemm", "--experts", "100000", "--n", "100000", "--k", "100000", "--tokens-per-expert", "1")
	require.ErrorContains(t, err, "bench grouped-gemm: these sizes need about")
	_, _, err = runCLI("bench", "grouped-gemm", "--n", "4096", "--k", "4096", "--tokens-per-expert", "1", "--max-memory-gib", "0.01")
	require.ErrorContains(t, err, "over --max-memory-gib 0.0")
	_, _, err = runCLI("bench", "grouped-gemm", "--max-memory-gib", "-1")
	require.ErrorContains(t, err, "--max-memory-gib -1 must be a positive finite number")
	out, _, err = runCLI("bench", "grouped-gemm", "--n", "4", "--k", "4", "--tokens-per-expert", "0", "--min-time", "0", "--max-runs", "1", "--format", "json")
	require.NoError(t, err)
	var r0 benchResult
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &r0))
	require.Zero(t, r0.Bytes)
	require.Zero(t, r0.BWFraction)

	_, _, err = runCLI("bench", "grouped-gemm", "--layout", "cols", "--n", "4", "--k", "4")
	require.ErrorContains(t, err, `--layout "cols" (want packed or rows)`)
	_, _, err = runCLI("bench", "grouped-gemm", "--impl", "sve2", "--min-time", "0", "--n", "4", "--k", "4", "--tokens-per-expert", "1")
	require.ErrorContains(t, err, `implementation "sve2" is not available`)
	_, _, err = runCLI("bench", "moe", "--min-time", "0")
	require.ErrorContains(t, err, "bench moe: --model DIR or --preset deepseek-v2-lite|gpt-oss-20b is required")
	_, _, err = runCLI("bench", "nothing")
	require.ErrorContains(t, err, `unknown benchmark "nothing"`)
}

// TestExecMoEExpertParallel: --ep R writes the same bytes as --ep 1 for
// every placement, R from 1 to past the expert count.
func TestExecMoEExpertParallel(t *testing.T) {
	for _, name := range []string{"deepseek_v3_f32", "qwen2_moe_bf16", "mixtral_bf16_sharded"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "..", "testdata", "moe", name)
			layer, err := os.ReadFile(filepath.Join(dir, "layer"))
			require.NoError(t, err)
			tmp := t.TempDir()
			run := func(tag string, extra ...string) [3][]byte {
				y, ids, w := filepath.Join(tmp, tag+"y.npy"), filepath.Join(tmp, tag+"ids.npy"), filepath.Join(tmp, tag+"w.npy")
				args := append([]string{"exec", "moe", "--model", dir, "--layer", string(layer), "--input", filepath.Join(dir, "x.npy"),
					"--out", y, "--ids-out", ids, "--weights-out", w}, extra...)
				_, _, err := runCLI(args...)
				require.NoError(t, err, "%v", extra)
				var out [3][]byte
				for i, p := range []string{y, ids, w} {
					out[i], err = os.ReadFile(p)
					require.NoError(t, err)
				}
				return out
			}
			want := run("one")
			for _, r := range []string{"2", "3", "4", "7", "20"} {
				for _, p := range []string{"contiguous", "round-robin", "balanced"} {
					got := run(r+p, "--ep", r, "--placement", p)
					require.Equal(t, want, got, "--ep %s --placement %s", r, p)
				}
			}
		})
	}
	dir := filepath.Join("..", "..", "testdata", "moe", "mixtral_f32")
	_, _, err := runCLI("exec", "moe", "--model", dir, "--layer", "1", "--input", filepath.Join(dir, "x.npy"), "--out",
		filepath.Join(t.TempDir(), "y.npy"), "--ep", "2", "--comm", "mpi")
	if err != nil { // a build with MPI needs mpirun; either way no output without it
		require.ErrorContains(t, err, "MPI")
	}
	_, _, err = runCLI("exec", "moe", "--model", dir, "--layer", "1", "--input", filepath.Join(dir, "x.npy"), "--out",
		filepath.Join(t.TempDir(), "y.npy"), "--ep", "2", "--placement", "zigzag")
	require.ErrorContains(t, err, `--placement "zigzag"`)
}

// TestExecMLADecode: random caches with scattered block tables, lengths 1,
// a block boundary and thousands, against the float64 reference.
func TestExecMLADecode(t *testing.T) {
	const B, H, D, dv, bs = 5, 8, 576, 512, 64
	lens := []int32{1, 64, 65, 2500, 300}
	rng := rand.New(rand.NewPCG(11, 12))
	maxBlocks := 0
	total := 0
	for _, l := range lens {
		n := (int(l) + bs - 1) / bs
		maxBlocks = max(maxBlocks, n)
		total += n
	}
	nb := total + 3 // a few blocks nobody uses
	perm := rng.Perm(nb)
	kv := make([]float32, nb*bs*D)
	for i := range kv {
		kv[i] = float32(rng.NormFloat64())
	}
	bt := make([]int32, B*maxBlocks)
	for i := range bt {
		bt[i] = -1
	}
	next := 0
	for b, l := range lens {
		for j := 0; j < (int(l)+bs-1)/bs; j++ {
			bt[b*maxBlocks+j] = int32(perm[next])
			next++
		}
	}
	q := make([]float32, B*H*D)
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	dir := t.TempDir()
	p := func(n string) string { return filepath.Join(dir, n) }
	require.NoError(t, npy.WriteFloat32(p("q.npy"), []int{B, H, D}, q))
	require.NoError(t, npy.WriteFloat32(p("kv.npy"), []int{nb, bs, D}, kv))
	require.NoError(t, npy.WriteInt32(p("bt.npy"), []int{B, maxBlocks}, bt))
	require.NoError(t, npy.WriteInt32(p("sl.npy"), []int{B}, lens))
	scale := float32(1 / math.Sqrt(192))
	args := []string{"exec", "mla-decode", "--q", p("q.npy"), "--kv-cache", p("kv.npy"), "--block-table", p("bt.npy"),
		"--seqlens", p("sl.npy"), "--dv", "512", "--scale", fmt.Sprint(scale), "--out", p("o.npy"), "--lse-out", p("lse.npy")}
	_, _, err := runCLI(args...)
	require.NoError(t, err)
	o, err := npy.ReadFloat32(p("o.npy"))
	require.NoError(t, err)
	require.Equal(t, []int{B, H, dv}, o.Shape)
	lse, err := npy.ReadFloat32(p("lse.npy"))
	require.NoError(t, err)
	require.Equal(t, []int{B, H}, lse.Shape)
	for b, l := range lens {
		rows := make([][]float64, l)
		for i := range rows {
			blk := int(bt[b*maxBlocks+i/bs])
			rows[i] = make([]float64, D)
			for x := range rows[i] {
				rows[i][x] = float64(kv[(blk*bs+i%bs)*D+x])
			}
		}
		wo, wl := moetest.MLA(rows, q[b*H*D:(b+1)*H*D], H, D, dv, float64(scale))
		oref := make([]float64, len(wo))
		copy(oref, wo)
		require.LessOrEqual(t, moetest.RelErr(o.Data[b*H*dv:(b+1)*H*dv], oref), 1e-5, "sequence %d (len %d)", b, l)
		require.LessOrEqual(t, moetest.RelErr(lse.Data[b*H:(b+1)*H], wl), 1e-5, "lse of sequence %d", b)
	}

	// Bad input: a used block-table entry of -1, a zero length.
	bad := append([]int32(nil), bt...)
	bad[3*maxBlocks+1] = -1
	require.NoError(t, npy.WriteInt32(p("bad.npy"), []int{B, maxBlocks}, bad))
	args[7] = p("bad.npy")
	_, _, err = runCLI(args...)
	require.ErrorContains(t, err, "query 3: block table entry 1 is -1")
	args[7] = p("bt.npy")
	require.NoError(t, npy.WriteInt32(p("sl0.npy"), []int{B}, []int32{1, 0, 1, 1, 1}))
	args[9] = p("sl0.npy")
	_, _, err = runCLI(args...)
	require.ErrorContains(t, err, "sequence 1 has length 0")
	args[9] = p("sl.npy")

	// Flags: each named with its rule, before any file is read.
	for _, tt := range []struct{ flag, value, want string }{
		{"--scale", "NaN", "--scale NaN must be a positive finite number"},
		{"--scale", "-1", "--scale -1 must be a positive finite number"},
		{"--scale", "+Inf", "--scale +Inf must be a positive finite number"},
		{"--dv", "0", "--dv must be positive (got 0)"},
		{"--scale", "1e300", "--scale 1e+300 is outside float32's range"},
		{"--scale", "1e-300", "--scale 1e-300 is outside float32's range"},
	} {
		bad := append([]string(nil), args...)
		i := slices.Index(bad, tt.flag)
		bad[i+1] = tt.value
		_, _, err = runCLI(bad...)
		require.ErrorContains(t, err, tt.want)
	}
	i := slices.Index(args, "--scale")
	noScale := slices.Delete(append([]string(nil), args...), i, i+2)
	require.NotContains(t, noScale, "--scale")
	_, _, err = runCLI(noScale...)
	require.ErrorContains(t, err, "--scale is required")
	_, _, err = runCLI(append(append([]string(nil), args...), "--split", "-1")...)
	require.ErrorContains(t, err, "--split -1 must be a positive row count (or 0: the default)")
	_, _, err = runCLI(append(append([]string(nil), args...), "--lse-out", filepath.Join(t.TempDir(), "no", "l.npy"))...)
	require.ErrorContains(t, err, "does not exist")
}

// TestRunFlags: moex run refuses bad flags before it builds anything.
func TestRunFlags(t *testing.T) {
	for _, tt := range []struct{ flag, value, want string }{
		{"--kv-budget-gib", "-1", "--kv-budget-gib -1 must be a positive finite number of GiB"},
		{"--kv-budget-gib", "NaN", "--kv-budget-gib NaN must be"},
		{"--timeout", "0s", "--timeout 0s must be positive"},
		{"--deadline", "-1s", "--deadline -1s must be positive (or 0: no limit)"},
		{"--attn", "sp", `--attn "sp" (want dp or tp)`},
		{"--numerics", "fast", `numerics "fast": want exact, int8dot or bf16dot`},
	} {
		_, stderr, err := runCLI("run", tt.flag, tt.value)
		require.ErrorContains(t, err, tt.want)
		require.Empty(t, stderr, "nothing ran")
	}
	for _, args := range [][]string{{"--numerics", "bf16dot", "--backend", "cuda"}, {"--numerics", "int8dot", "--comm", "nccl"}} {
		_, stderr, err := runCLI(append([]string{"run"}, args...)...)
		require.ErrorContains(t, err, "runs on --backend cpu")
		require.Empty(t, stderr, "nothing ran")
	}
}

func TestRunMainJob(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "moe", "deepseek_v2_f32")
	for _, mode := range []string{"alltoall", "gather"} {
		out, _, err := runCLI("run", "--model", dir, "--layer", "1", "--ranks", "3", "--steps", "4", "--moe-mode", mode)
		require.NoError(t, err)
		require.Contains(t, out, "parity against one rank")
		require.Contains(t, out, ": ok")
		require.Contains(t, out, "tokens/s")
	}
	out, _, err := runCLI("run", "--model", dir, "--layer", "1", "--ranks", "2", "--steps", "3", "--attn", "tp", "--batch", "2", "--context", "8")
	require.NoError(t, err)
	require.Contains(t, out, "TP attention, MoE mode gather")
	require.Contains(t, out, "parity against one rank (within 1e-5 expected)")
	require.Contains(t, out, ": ok")
	_, _, err = runCLI("run", "--attn", "tp", "--moe-mode", "alltoall")
	require.ErrorContains(t, err, "--attn tp runs the MoE layer as expert shards over every token (gather mode), not --moe-mode alltoall")

	// The bf16-dot mode on a bf16 layer: ranks agree with one rank; an
	// fp32 layer refuses it by name.
	bf := filepath.Join("..", "..", "testdata", "moe", "deepseek_v2_bf16_glg")
	out, _, err = runCLI("run", "--model", bf, "--layer", "0", "--ranks", "2", "--steps", "2", "--numerics", "bf16dot")
	require.NoError(t, err)
	require.Contains(t, out, "experts in bf16dot numerics")
	require.Contains(t, out, ": ok")
	_, _, err = runCLI("run", "--model", dir, "--layer", "1", "--steps", "1", "--numerics", "bf16dot")
	require.ErrorContains(t, err, "bf16dot numerics need BF16 weights, have F32")
}

// TestExecMoECheckWeights: --check-weights names the first non-finite
// expert weight before running; without it, a token that meets the
// weight is reported as a non-finite output, and EP ranks do the same.
func TestExecMoECheckWeights(t *testing.T) {
	spec := moetest.Spec{ModelType: "qwen3_moe", Hidden: 16, Experts: 4, TopK: 4, Inter: 8, DType: "F32", NumLayers: 1, Seed: 99}
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	const bad = "model.layers.0.mlp.experts.2.up_proj.weight"
	found := false
	for i := range m.Tensors {
		if m.Tensors[i].Name == bad {
			binary.LittleEndian.PutUint32(m.Tensors[i].Data[4*(5*16+9):], math.Float32bits(float32(math.Inf(1))))
			found = true
		}
	}
	require.True(t, found)
	dir := t.TempDir()
	require.NoError(t, m.WriteTo(dir))
	xp, yp := filepath.Join(dir, "x.npy"), filepath.Join(dir, "y.npy")
	require.NoError(t, npy.WriteFloat32(xp, []int{5, spec.Hidden}, moetest.Input(3, 5, spec.Hidden, false)))
	args := []string{"exec", "moe", "--model", dir, "--layer", "0", "--input", xp, "--out", yp}
	_, _, err = runCLI(append(args, "--check-weights")...)
	require.ErrorContains(t, err, dir+": layer 0: moe: expert 2 up_proj [5, 9] is +Inf")
	_, _, err = runCLI(append(args, "--check-weights", "--ep", "2")...)
	require.ErrorContains(t, err, "expert 2 up_proj [5, 9] is +Inf")
	for _, ep := range []string{"1", "2"} {
		_, _, err = runCLI(append(args, "--ep", ep)...) // top-4 of 4: every token meets expert 2
		require.ErrorContains(t, err, "output token 0 is ", "--ep %s", ep)
		require.ErrorContains(t, err, "CheckWeights finds it", "--ep %s", ep)
	}
}

// TestExecMoEFreshFamilies: one checkpoint of each family added beside
// gpt-oss, with sizes and seeds no stored case has.
func TestExecMoEFreshFamilies(t *testing.T) {
	for _, s := range []moetest.Spec{
		{ModelType: "llama4", Hidden: 48, Experts: 10, TopK: 1, Inter: 24, NumLayers: 4, Layer: 3, SparseStep: 2, DType: "BF16", Seed: 4545},
		{ModelType: "ernie4_5_moe", Hidden: 40, Experts: 12, TopK: 4, Inter: 20, SharedExperts: 2, NumLayers: 3, Layer: 2, FirstKDense: 1, DType: "BF16", Seed: 4646},
		{ModelType: "glm4_moe", Hidden: 40, Experts: 16, TopK: 4, Inter: 12, SharedExperts: 1, NGroup: 1, TopKGroup: 1, NormTopK: true, Scaling: 2.5, DType: "F32", Seed: 4747},
		{ModelType: "minimax_m2", Hidden: 64, Experts: 12, TopK: 3, Inter: 32, DType: "F8_E4M3", FP8Block: [2]int{32, 32}, Seed: 4848},
		{ModelType: "olmoe", Hidden: 40, Experts: 9, TopK: 3, Inter: 20, DType: "BF16", Shards: 2, Seed: 4949},
		{ModelType: "qwen3_vl_moe", Hidden: 40, Experts: 9, TopK: 2, Inter: 20, DType: "BF16", Seed: 5050},
		{ModelType: "dots1", Hidden: 40, Experts: 8, TopK: 3, Inter: 12, SharedExperts: 2, NGroup: 2, TopKGroup: 1, NormTopK: true, Scaling: 2.5, DType: "BF16", Seed: 5151},
		{ModelType: "deepseek_v4", Hidden: 40, Experts: 12, TopK: 3, Inter: 16, SharedExperts: 1, Scaling: 1.5, NumLayers: 5, Layer: 2, HashLayers: 3, Vocab: 70, DType: "BF16", Seed: 5252},
		{ModelType: "deepseek_v4", Hidden: 40, Experts: 12, TopK: 3, Inter: 16, SharedExperts: 1, Scaling: 1.5, NumLayers: 5, Layer: 4, HashLayers: 3, Vocab: 70, SwigluLimit: 0.3, DType: "F32", Seed: 5353},
		{ModelType: "gemma4", Hidden: 40, Experts: 10, TopK: 4, Inter: 16, DenseInter: 28, NumLayers: 2, Layer: 1, DType: "BF16", Seed: 5454},
		{ModelType: "step3_text", Hidden: 40, Experts: 9, TopK: 3, Inter: 16, SharedInter: 20, NumLayers: 3, Layer: 1, FirstKDense: 1, DType: "BF16", Shards: 2, Seed: 5757},
	} {
		execFresh(t, s, 13)
	}
}

// TestExecMoETokenIDs: a hash layer without token ids or with ids of
// another length is a named error, one rank or several; with them, several
// ranks give one rank's output.
func TestExecMoETokenIDs(t *testing.T) {
	spec := moetest.Spec{ModelType: "deepseek_v4", Hidden: 16, Experts: 6, TopK: 2, Inter: 8, SharedExperts: 1, NumLayers: 2, Layer: 0,
		HashLayers: 1, Vocab: 9, DType: "BF16", Seed: 5555}
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, m.WriteTo(dir))
	xp, yp := filepath.Join(dir, "x.npy"), filepath.Join(dir, "y.npy")
	require.NoError(t, npy.WriteFloat32(xp, []int{4, 16}, moetest.Input(1, 4, 16, false)))
	tp := filepath.Join(dir, "tokens.npy")
	require.NoError(t, npy.WriteInt32(tp, []int{3}, []int32{1, 2, 3}))
	base := []string{"exec", "moe", "--model", dir, "--layer", "0", "--input", xp, "--out", yp}
	_, _, err = runCLI(base...)
	require.ErrorContains(t, err, "its forward pass needs the batch's token ids")
	_, _, err = runCLI(append(base, "--tokens", tp)...)
	require.ErrorContains(t, err, "shape [3], want [4]: one token id per row of")
	require.NoError(t, npy.WriteInt32(tp, []int{4}, []int32{1, 2, 9, 3}))
	_, _, err = runCLI(append(base, "--tokens", tp)...)
	require.ErrorContains(t, err, "token 2 has id 9, outside the hash layer's tid2eid table of vocab_size 9 rows")
	// Over ranks (each routing its own tokens' ids, a balanced placement
	// routing them once more) the same bits as on one.
	require.NoError(t, npy.WriteInt32(tp, []int{4}, []int32{1, 2, 8, 3}))
	_, _, err = runCLI(append(base, "--tokens", tp)...)
	require.NoError(t, err)
	one, err := npy.ReadFloat32(yp)
	require.NoError(t, err)
	yp2 := filepath.Join(dir, "y2.npy")
	base[len(base)-1] = yp2
	_, _, err = runCLI(append(base, "--tokens", tp, "--ep", "3", "--placement", "balanced")...)
	require.NoError(t, err)
	three, err := npy.ReadFloat32(yp2)
	require.NoError(t, err)
	require.Equal(t, one.Data, three.Data)
	_, _, err = runCLI(append(base, "--ep", "2")...)
	require.ErrorContains(t, err, "its forward pass needs the batch's token ids")
}

// TestExecMoEGGUF: exec moe on a GGUF file (DeepSeek-V3's block, BF16
// experts, layer 2 after two dense ones) gives the float64 reference and
// its experts; --ranks 2 over a GGUF file is refused by name; --numerics
// int8dot on its BF16 experts is refused naming the matrix, and on Q8_0
// ones runs within the mode's error (exact without it).
func TestExecMoEGGUF(t *testing.T) {
	spec := moetest.Spec{ModelType: "deepseek_v3", Hidden: 48, Experts: 16, TopK: 4, Inter: 24, SharedExperts: 1,
		Method: "noaux_tc", Scoring: "sigmoid", NGroup: 4, TopKGroup: 2, NormTopK: true, Scaling: 2.5,
		NumLayers: 3, Layer: 2, FirstKDense: 2, DType: "BF16", Seed: 4343}
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	dir := t.TempDir()
	data, err := m.GGUF("deepseek2", 30)
	require.NoError(t, err)
	model := filepath.Join(dir, "DeepSeek-V3-tiny-BF16.gguf")
	require.NoError(t, os.WriteFile(model, data, 0o644))
	x := moetest.Input(77, 13, spec.Hidden, false)
	xp, yp, ip := filepath.Join(dir, "x.npy"), filepath.Join(dir, "y.npy"), filepath.Join(dir, "ids.npy")
	require.NoError(t, npy.WriteFloat32(xp, []int{13, spec.Hidden}, x))
	_, _, err = runCLI("exec", "moe", "--model", model, "--layer", "2", "--input", xp, "--out", yp, "--ids-out", ip)
	require.NoError(t, err)
	requireOutputs(t, yp, ip, m.Forward(x))
	_, _, err = runCLI("exec", "moe", "--model", model, "--layer", "2", "--input", xp, "--out", yp, "--ep", "2")
	require.ErrorContains(t, err, "expert parallelism over a GGUF file is not supported yet")
	_, _, err = runCLI("exec", "moe", "--model", model, "--layer", "2", "--input", xp, "--out", yp, "--numerics", "int8dot")
	require.ErrorContains(t, err, "expert 0's gate: kernels: int8dot numerics need UINT4, INT8, MXFP4 or INT4 weights, have BF16")
	_, _, err = runCLI("exec", "moe", "--model", model, "--layer", "2", "--input", xp, "--out", yp, "--numerics", "fast")
	require.ErrorIs(t, err, errUsage)
	_, _, err = runCLI("exec", "moe", "--model", model, "--layer", "2", "--input", xp, "--out", yp, "--numerics", "int8dot", "--ep", "2")
	require.ErrorContains(t, err, "--numerics int8dot runs on one CPU rank")

	// Q8_0 experts (codes times 2^-7, so that the reference's weights are
	// the blocks' values): exact by default, within the int8-dot mode's
	// error when asked for it.
	spec.Hidden, spec.Inter = 64, 32 // whole blocks
	m, err = moetest.Generate(spec)
	require.NoError(t, err)
	x = moetest.Input(78, 13, spec.Hidden, false)
	require.NoError(t, npy.WriteFloat32(xp, []int{13, spec.Hidden}, x))
	rng := rand.New(rand.NewPCG(5, 5))
	q8 := map[string][]byte{}
	for e := range m.Experts {
		for _, p := range []struct {
			name string
			w    [][]float64
		}{{"ffn_gate_exps", m.Experts[e].Gate}, {"ffn_up_exps", m.Experts[e].Up}, {"ffn_down_exps", m.Experts[e].Down}} {
			for _, row := range p.w {
				for b := 0; b < len(row); b += 32 {
					q8[p.name] = append(q8[p.name], 0x00, 0x20) // d = 2^-7 as an f16
					for j := range 32 {
						c := int8(rng.IntN(255) - 127)
						q8[p.name] = append(q8[p.name], byte(c))
						row[b+j] = float64(c) / 128
					}
				}
			}
		}
	}
	data, err = m.GGUFQuant("deepseek2", 30, map[string]uint32{"ffn_gate_exps": 8, "ffn_up_exps": 8, "ffn_down_exps": 8}, q8)
	require.NoError(t, err)
	q8model := filepath.Join(dir, "DeepSeek-V3-tiny-Q8_0.gguf")
	require.NoError(t, os.WriteFile(q8model, data, 0o644))
	ref := m.Forward(x)
	_, _, err = runCLI("exec", "moe", "--model", q8model, "--layer", "2", "--input", xp, "--out", yp, "--ids-out", ip)
	require.NoError(t, err)
	requireOutputs(t, yp, ip, ref)
	_, _, err = runCLI("exec", "moe", "--model", q8model, "--layer", "2", "--input", xp, "--out", yp, "--ids-out", ip, "--numerics", "int8dot")
	require.NoError(t, err)
	y8, err := npy.ReadFloat32(yp)
	require.NoError(t, err)
	e := moetest.RelErr(y8.Data, ref.Y)
	require.Greater(t, e, 1e-6)
	require.LessOrEqual(t, e, 2e-2)
	ids, err := npy.ReadInt32(ip)
	require.NoError(t, err)
	require.Equal(t, ref.IDs, ids.Data)

	// moex run over the GGUF file's MoE block (its attention random, said so).
	out, _, err := runCLI("run", "--model", model, "--layer", "2", "--ranks", "2", "--steps", "2")
	require.NoError(t, err)
	require.Contains(t, out, "of a GGUF file moex reads the MoE block only")
	require.Contains(t, out, "bit-identical true")
}
