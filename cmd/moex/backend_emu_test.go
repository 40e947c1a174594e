//go:build cudaemu && !cuda

package main

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/internal/npy"
	"github.com/moex-project/moex/internal/stwrite"
	"github.com/moex-project/moex/model"
)

// TestExecBackendCUDA runs `exec moe` and `exec mla-decode` with --backend
// cuda on the emulated kernels against the stored float64 reference and
// the CPU backend.
func TestExecBackendCUDA(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "moe", "mixtral_f32")
	tmp := t.TempDir()
	y, ids := filepath.Join(tmp, "y.npy"), filepath.Join(tmp, "ids.npy")
	_, _, err := runCLI("exec", "moe", "--backend", "cuda", "--model", dir, "--layer", "1", "--input", filepath.Join(dir, "x.npy"),
		"--out", y, "--ids-out", ids)
	require.NoError(t, err)
	// bf16 activations and weights on the device: about 1e-2 of the reference.
	compareNpy(t, filepath.Join(dir, "y.npy"), y, 1e-2)
	want, err := npy.ReadInt32(filepath.Join(dir, "ids.npy"))
	require.NoError(t, err)
	got, err := npy.ReadInt32(ids)
	require.NoError(t, err)
	require.Equal(t, want, got)

	_, _, err = runCLI("exec", "moe", "--backend", "cuda", "--ep", "2", "--model", dir, "--layer", "1", "--input",
		filepath.Join(dir, "x.npy"), "--out", y)
	require.ErrorContains(t, err, "--backend cuda runs one rank")
	_, _, err = runCLI("exec", "moe", "--backend", "tpu", "--model", dir, "--layer", "1", "--input", filepath.Join(dir, "x.npy"), "--out", y)
	require.ErrorContains(t, err, `--backend "tpu" (want cpu or cuda)`)

	// MLA decode: three sequences over a shuffled paged cache.
	const B, H, D, dv, bs = 3, 2, 64, 48, 16
	lens := []int32{1, 16, 50}
	rng := rand.New(rand.NewPCG(3, 4))
	maxBlocks := 4
	nb := 8
	kv := make([]float32, nb*bs*D)
	for i := range kv {
		kv[i] = float32(rng.NormFloat64())
	}
	perm := rng.Perm(nb)
	bt := make([]int32, B*maxBlocks)
	next := 0
	for b := range lens {
		for j := 0; j < maxBlocks; j++ {
			bt[b*maxBlocks+j] = -1
			if j < (int(lens[b])+bs-1)/bs {
				bt[b*maxBlocks+j] = int32(perm[next])
				next++
			}
		}
	}
	q := make([]float32, B*H*D)
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	p := func(n string) string { return filepath.Join(tmp, n) }
	require.NoError(t, npy.WriteFloat32(p("q.npy"), []int{B, H, D}, q))
	require.NoError(t, npy.WriteFloat32(p("kv.npy"), []int{nb, bs, D}, kv))
	require.NoError(t, npy.WriteInt32(p("bt.npy"), []int{B, maxBlocks}, bt))
	require.NoError(t, npy.WriteInt32(p("sl.npy"), []int{B}, lens))
	args := []string{"exec", "mla-decode", "--q", p("q.npy"), "--kv-cache", p("kv.npy"), "--block-table", p("bt.npy"),
		"--seqlens", p("sl.npy"), "--dv", "48", "--scale", "0.125"}
	_, _, err = runCLI(append(args, "--out", p("cpu.npy"), "--lse-out", p("cpu_lse.npy"))...)
	require.NoError(t, err)
	_, _, err = runCLI(append(args, "--backend", "cuda", "--split", "16", "--out", p("gpu.npy"), "--lse-out", p("gpu_lse.npy"))...)
	require.NoError(t, err)
	for _, pair := range [][2]string{{"cpu.npy", "gpu.npy"}, {"cpu_lse.npy", "gpu_lse.npy"}} {
		a, err := npy.ReadFloat32(p(pair[0]))
		require.NoError(t, err)
		b, err := npy.ReadFloat32(p(pair[1]))
		require.NoError(t, err)
		require.Equal(t, a.Shape, b.Shape)
		for i := range a.Data {
			require.InDelta(t, a.Data[i], b.Data[i], 1e-5*(1+math.Abs(float64(a.Data[i]))), "%s[%d]", pair[1], i)
		}
	}

	// A block-table entry outside the cache is an error, not a wild read.
	bt[1*maxBlocks] = int32(nb)
	require.NoError(t, npy.WriteInt32(p("bt.npy"), []int{B, maxBlocks}, bt))
	_, _, err = runCLI(append(args, "--backend", "cuda", "--out", p("gpu.npy"))...)
	require.EqualError(t, err, "cuda: mla decode: query 1: block table entry 0 is 8, out of range [0, 8)")
}

// TestRunBackendCUDA: moex run with every rank's experts on the (emulated)
// device, both MoE modes, parity with the CPU within bf16 tolerance.
func TestRunBackendCUDA(t *testing.T) {
	// A small DeepSeek layer (MoE and MLA), sizes the device kernels take.
	ms := moetest.Spec{ModelType: "deepseek_v2", Hidden: 32, Experts: 4, TopK: 2, Inter: 16, SharedExperts: 1,
		Method: "greedy", Scoring: "softmax", NGroup: 1, TopKGroup: 1, DType: "BF16", Seed: 3}
	m, err := moetest.Generate(ms)
	require.NoError(t, err)
	am, err := moetest.GenerateAttention(moetest.AttnSpec{Hidden: 32, Heads: 2, KVLoraRank: 48, Nope: 16, Rope: 16,
		VDim: 16, Theta: 10000, DType: "BF16", Seed: 3})
	require.NoError(t, err)
	for k, v := range am.Config {
		m.Config[k] = v
	}
	dir := t.TempDir()
	require.NoError(t, stwrite.WriteCheckpoint(dir, m.Config, append(m.Tensors, am.Tensors...), 1))
	for _, mode := range []string{"alltoall", "gather", "gather-stages"} {
		args := []string{"run", "--backend", "cuda", "--model", dir, "--layer", "0", "--ranks", "3", "--steps", "2", "--moe-mode", mode}
		if mode == "gather-stages" {
			args[len(args)-1] = "gather"
			args = append(args, "--fused-layer=false")
		}
		out, _, err := runCLI(args...)
		require.NoError(t, err)
		t.Logf("%s", out)
		require.Contains(t, out, "backend: on the CPU emulation of the CUDA kernels, bf16 activations, CUDA graphs per bucket, "+
			"replayed when the vote allows: ")
		switch mode {
		case "gather":
			require.Contains(t, out, "each rank's whole layer step (MLA block with RMSNorm")
			require.Contains(t, out, "CUDA graph replays per rank: [")
		case "gather-stages":
			require.Contains(t, out, "then the whole MoE stage (the hidden states all-gathered and reduce-scattered in device memory")
		default:
			require.Contains(t, out, "and the experts of each rank's shard")
		}
		require.Contains(t, out, "parity against one rank (within 1e-2 of the CPU path expected)")
		require.Contains(t, out, ": ok")
	}
}

// TestBenchMoEBackendCUDA: bench moe on the device, eager and graph
// replays, one JSON object per case.
func TestBenchMoEBackendCUDA(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "moe", "mixtral_f32")
	out, _, err := runCLI("bench", "moe", "--backend", "cuda", "--model", dir, "--layer", "1", "--tokens", "1,3",
		"--format", "json", "--min-time", "1ms")
	require.NoError(t, err)
	var impls []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r benchResult
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		require.Positive(t, r.MedianNS)
		require.Positive(t, r.GBPS)
		impls = append(impls, r.Impl)
	}
	require.Equal(t, []string{"cuda", "cuda-graph", "cuda", "cuda-graph"}, impls)
}

// TestServeBackendCUDA: the tiny model with its attention and experts on
// the emulated device gives every position's logits within 2e-2 of the
// host's (bf16 on the device), and moex serve --backend cuda answers.
func TestServeBackendCUDA(t *testing.T) {
	host, err := model.NewRandom(model.Tiny(), 3)
	require.NoError(t, err)
	dev, err := model.NewRandom(model.Tiny(), 3)
	require.NoError(t, err)
	closeDev, err := modelOnDevice(dev)
	require.NoError(t, err)
	defer closeDev()
	ids := moetest.Tokens(5, 16, model.ByteVocab)
	want, err := host.Prefill(context.Background(), ids)
	require.NoError(t, err)
	got, err := dev.Prefill(context.Background(), ids)
	require.NoError(t, err)
	var num, den float64
	for i := range want {
		d := float64(got[i] - want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	rel := math.Sqrt(num / den)
	t.Logf("device logits against the host's: relative error %.2e", rel)
	require.LessOrEqual(t, rel, 2e-2)

	url, stop := startServe(t, "--preset", "tiny", "--backend", "cuda")
	resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(`{"text": "hi", "sampling_params": {"max_new_tokens": 3, "ignore_eos": true}}`))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	require.Contains(t, string(b), `"completion_tokens":3`)
	require.NoError(t, stop())
	http.DefaultClient.CloseIdleConnections()
}
