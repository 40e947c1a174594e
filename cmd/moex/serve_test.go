package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/loadgen"
	"github.com/moex-project/moex/model"
)

// startServe runs moex serve with args on a free port until the returned
// stop, and returns its URL.
func startServe(t *testing.T, args ...string) (url string, stop func() error) {
	return startUntil(t, serveUntil, args...)
}

// startUntil runs a server command (serveUntil, routeUntil) with args on a
// free port until the returned stop, and returns the URL it prints.
func startUntil(t *testing.T, run func(context.Context, []string, io.Writer, io.Writer) error, args ...string) (url string, stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append(args, "--port", "0"), pw, io.Discard)
		pw.Close()
	}()
	lines := bufio.NewScanner(pr)
	require.True(t, lines.Scan())
	first := lines.Text()
	_, url, ok := strings.Cut(first, " on ")
	require.True(t, ok, first)
	go func() {
		for lines.Scan() {
		}
	}()
	return strings.Fields(url)[0], func() error { cancel(); return <-done }
}

// TestServeDP: --dp 2 in gather mode gives the greedy tokens one rank
// gives, and reports its size.
func TestServeDP(t *testing.T) {
	body := `{"text": "hello", "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": true}}`
	var outs []string
	for dp, args := range [][]string{{"--preset", "tiny"}, {"--preset", "tiny", "--dp", "2", "--moe-mode", "gather", "--load-balance-method", "shortest_queue"}} {
		url, stop := startServe(t, args...)
		resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		var g struct {
			IDs []int32 `json:"output_ids"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&g))
		resp.Body.Close()
		outs = append(outs, fmt.Sprint(g.IDs))
		resp, err = http.Get(url + "/get_server_info")
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Contains(t, string(b), fmt.Sprintf(`"dp_size":%d`, dp+1))
		require.NoError(t, stop())
	}
	require.Equal(t, outs[0], outs[1])
	http.DefaultClient.CloseIdleConnections()
}

// TestServe: moex serve --preset tiny on a free loopback port answers
// /generate and /health, and stops cleanly when its context ends (as on
// SIGTERM); bad flags are usage errors.
func TestServe(t *testing.T) {
	url, stop := startServe(t, "--preset", "tiny", "--kv-blocks", "64")

	resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(`{"text": "hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": true}}`))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	require.Contains(t, string(b), `"completion_tokens":4`)
	resp, err = http.Get(url + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// bench serve against it: every request completes, and the prompts
	// after each group's first find its 64-token system prompt cached.
	var out strings.Builder
	require.NoError(t, benchServe([]string{"--url", url, "--groups", "2", "--prompts-per-group", "3", "--system-len", "64",
		"--question-len", "8", "--output-len", "3", "--format", "json"}, &out, io.Discard))
	var rep loadgen.Report
	require.NoError(t, json.Unmarshal([]byte(out.String()), &rep))
	require.Equal(t, 6, rep.Completed)
	require.Equal(t, 18, rep.OutputTokens)
	require.Equal(t, 4*64, rep.CachedTokens)

	// SIGTERM (here: the context) while a request streams: it finishes.
	resp, err = http.Post(url+"/generate", "application/json", strings.NewReader(`{"text": "hi", "sampling_params": {"max_new_tokens": 300, "ignore_eos": true}, "stream": true}`))
	require.NoError(t, err)
	frames := bufio.NewScanner(resp.Body)
	require.True(t, frames.Scan()) // it runs
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	var tail []string
	for frames.Scan() {
		if f := frames.Text(); f != "" {
			tail = append(tail, f)
		}
	}
	resp.Body.Close()
	require.Equal(t, "data: [DONE]", tail[len(tail)-1])
	require.Contains(t, tail[len(tail)-2], `"completion_tokens":300`, "the whole generation, not an error")
	require.NoError(t, <-stopped)
	http.DefaultClient.CloseIdleConnections()

	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "give --preset tiny or --model DIR"},
		{[]string{"--preset", "huge"}, `unknown --preset "huge"`},
		{[]string{"--preset", "tiny", "--kv-blocks", "0"}, "must be positive"},
		{[]string{"--preset", "tiny", "--port", "70000"}, "--port 70000 must be in [0, 65535]"},
		{[]string{"--preset", "tiny", "--kv-dtype", "fp8"}, `--kv-dtype "fp8" (want f32, bf16 or f16)`},
		{[]string{"--preset", "tiny", "--kv-dtype", "f16", "--backend", "cuda"}, "--kv-dtype f16 runs on the CPU: the device kernels read f32 or bf16 caches"},
		{[]string{"--preset", "tiny", "--model", "x"}, "give --preset or --model, not both"},
		{[]string{"--preset", "tiny", "--dp", "0"}, "--dp 0 must be in [1, 64]"},
		{[]string{"--preset", "tiny", "--dp", "2", "--moe-mode", "tp"}, `--moe-mode "tp"`},
		{[]string{"--preset", "tiny", "--load-balance-method", "random"}, `--load-balance-method "random"`},
		{[]string{"--preset", "tiny", "--layers", "-2"}, "--layers -2"},
	} {
		err := serveUntil(context.Background(), tt.args, io.Discard, io.Discard)
		require.ErrorIs(t, err, errUsage)
		require.ErrorContains(t, err, tt.want)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--rate", "0"}, `--rate "0" must be a positive number`},
		{[]string{"--rate", "fast"}, `--rate "fast"`},
		{[]string{"--dataset", "sharegpt"}, `unknown --dataset "sharegpt"`},
		{[]string{"--groups", "0"}, "0 groups of 8 prompts"},
		{[]string{"--url", "localhost:3"}, `url "localhost:3" must begin with http://`},
		{[]string{"--format", "xml"}, `--format "xml"`},
	} {
		err := benchServe(tt.args, io.Discard, io.Discard)
		require.ErrorIs(t, err, errUsage)
		require.ErrorContains(t, err, tt.want)
	}
}

// TestRoute: moex route in front of two tiny workers answers as a worker
// does (the same greedy tokens), sends a shared prefix to one worker, and
// bench serve through it completes; bad flags are usage errors.
func TestRoute(t *testing.T) {
	w1, stop1 := startServe(t, "--preset", "tiny", "--kv-blocks", "256")
	w2, stop2 := startServe(t, "--preset", "tiny", "--kv-blocks", "256")
	url, stopRouter := startUntil(t, routeUntil, "--worker", w1, "--worker", w2)
	body := `{"text": "hello", "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": true}}`
	var outs []string
	for _, u := range []string{w1, url} {
		resp, err := http.Post(u+"/generate", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		var g struct {
			IDs []int32 `json:"output_ids"`
		}
		require.NoError(t, json.Unmarshal(b, &g))
		outs = append(outs, fmt.Sprint(g.IDs))
	}
	require.Equal(t, outs[0], outs[1])
	var out strings.Builder
	require.NoError(t, benchServe([]string{"--url", url, "--groups", "2", "--prompts-per-group", "4", "--system-len", "64",
		"--question-len", "8", "--output-len", "2", "--format", "json"}, &out, io.Discard))
	var rep loadgen.Report
	require.NoError(t, json.Unmarshal([]byte(out.String()), &rep))
	require.Equal(t, 8, rep.Completed)
	require.NoError(t, stopRouter())
	require.NoError(t, stop1())
	require.NoError(t, stop2())
	http.DefaultClient.CloseIdleConnections()

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--policy", "fastest"}, `unknown policy "fastest"`},
		{[]string{"--cache-threshold", "2"}, "cache threshold 2"},
		{[]string{"--port", "-1"}, "--port -1"},
		{[]string{"--balance-rel-threshold", "0.5"}, "balance thresholds"},
	} {
		err := routeUntil(context.Background(), tt.args, io.Discard, io.Discard)
		require.ErrorIs(t, err, errUsage)
		require.ErrorContains(t, err, tt.want)
	}
	err := routeUntil(context.Background(), []string{"--worker", "localhost:1"}, io.Discard, io.Discard)
	require.ErrorContains(t, err, `worker URL "localhost:1": want http(s)://host:port`)
}

// TestServeGGUF: moex serve --model on a GGUF file of weights only (no
// vocabulary: requests give input_ids) generates, greedily, the tokens the
// model's own forward passes choose.
func TestServeGGUF(t *testing.T) {
	_, _, path := qwen3Whole(t, 33, 20, "F32")
	m, err := model.Load(path)
	require.NoError(t, err)
	defer m.Close()
	ids := []int32{3, 1, 4, 1, 5}
	kv, err := m.NewKV(4, 16, kernels.BF16) // as serve's cache
	require.NoError(t, err)
	logits, err := m.Forward(context.Background(), kv, make([]int, len(ids)), ids, []int{len(ids) - 1})
	require.NoError(t, err)
	var want []int32
	for range 4 {
		next := argmax(logits)
		want = append(want, next)
		if logits, err = m.Forward(context.Background(), kv, []int{0}, []int32{next}, nil); err != nil {
			t.Fatal(err)
		}
	}

	url, stop := startServe(t, "--model", path, "--kv-blocks", "16", "--kv-dtype", "bf16")
	resp, err := http.Post(url+"/generate", "application/json",
		strings.NewReader(`{"input_ids": [3, 1, 4, 1, 5], "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": true}}`))
	require.NoError(t, err)
	var g struct {
		IDs []int32 `json:"output_ids"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&g))
	resp.Body.Close()
	require.Equal(t, want, g.IDs)
	resp, err = http.Get(url + "/get_server_info")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// 2 layers × (keys and values of 1 head of 8) × 2 bytes.
	require.Contains(t, string(b), `"kv_bytes_per_token":64,"kv_cache_dtype":"bf16"`)
	require.NoError(t, stop())
	http.DefaultClient.CloseIdleConnections()
}

// TestServeGreedyFamilies: moex serve --model on a whole model of each
// family generates, greedily, the 32 tokens the float64 reference written
// from the family's modeling file continues the prompt with.
func TestServeGreedyFamilies(t *testing.T) {
	for name, spec := range map[string]moetest.WholeSpec{
		"qwen3_moe": {MoE: moetest.Spec{ModelType: "qwen3_moe", Experts: 4, TopK: 2, Inter: 8, NormTopK: true, DType: "F32"},
			GQA:    &moetest.GQASpec{Heads: 4, KVHeads: 2, HeadDim: 6, QKNorm: "head", Theta: 1e6},
			Hidden: 16, Layers: 2, Vocab: 19, DenseInter: 1, Seed: 41},
		"qwen2_moe": {MoE: moetest.Spec{ModelType: "qwen2_moe", Experts: 4, TopK: 2, Inter: 8, SharedInter: 8, DType: "F32"},
			GQA:    &moetest.GQASpec{Heads: 2, KVHeads: 2, HeadDim: 8, Bias: true, Theta: 1e6},
			Hidden: 16, Layers: 2, Vocab: 19, DenseInter: 1, Seed: 42},
		"mixtral": {MoE: moetest.Spec{ModelType: "mixtral", Experts: 4, TopK: 2, Inter: 8, DType: "F32"},
			GQA:    &moetest.GQASpec{Heads: 2, KVHeads: 1, HeadDim: 8, Window: 7, Theta: 1e6},
			Hidden: 16, Layers: 2, Vocab: 19, DenseInter: 1, Seed: 43},
		"olmoe": {MoE: moetest.Spec{ModelType: "olmoe", Experts: 4, TopK: 2, Inter: 8, DType: "F32"},
			GQA:    &moetest.GQASpec{Heads: 2, KVHeads: 2, HeadDim: 8, QKNorm: "whole", Theta: 10000},
			Hidden: 16, Layers: 2, Vocab: 19, DenseInter: 1, Seed: 44},
		"gpt_oss": {MoE: moetest.Spec{ModelType: "gpt_oss", Experts: 4, TopK: 2, Inter: 8, DType: "F32"},
			GQA: &moetest.GQASpec{Heads: 2, KVHeads: 1, HeadDim: 8, Bias: true, OutBias: true, Sinks: true, Window: 6, WindowEven: true,
				Yarn: true, Theta: 150000},
			Hidden: 16, Layers: 2, Vocab: 19, DenseInter: 1, Seed: 45},
		"glm4_moe": {MoE: moetest.Spec{ModelType: "glm4_moe", Experts: 4, TopK: 2, Inter: 8, SharedExperts: 1, NGroup: 1, TopKGroup: 1,
			NormTopK: true, Scaling: 2.5, DType: "F32"},
			GQA:    &moetest.GQASpec{Heads: 2, KVHeads: 1, HeadDim: 8, Bias: true, Partial: 0.5, Theta: 10000},
			Hidden: 16, Layers: 2, FirstKDense: 1, Vocab: 19, DenseInter: 12, Seed: 46},
		"deepseek_v2": {MoE: moetest.Spec{ModelType: "deepseek_v2", Experts: 4, TopK: 2, Inter: 8, SharedExperts: 1, Method: "greedy",
			Scoring: "softmax", NGroup: 1, TopKGroup: 1, DType: "F32"},
			Attn:   moetest.AttnSpec{Heads: 2, KVLoraRank: 8, Nope: 4, Rope: 4, VDim: 4, Theta: 10000},
			Hidden: 16, Layers: 2, FirstKDense: 1, Vocab: 19, DenseInter: 12, Seed: 47},
	} {
		t.Run(name, func(t *testing.T) {
			w, err := moetest.GenerateWhole(spec)
			require.NoError(t, err)
			dir := t.TempDir()
			require.NoError(t, w.WriteTo(dir))
			prompt := []int32{3, 1, 4, 1, 5}
			want := append([]int32(nil), prompt...)
			for range 32 {
				rows := w.Logits(want)
				last := rows[len(rows)-1]
				best := 0
				for v := range last {
					if last[v] > last[best] {
						best = v
					}
				}
				want = append(want, int32(best))
			}
			url, stop := startServe(t, "--model", dir, "--kv-blocks", "16", "--kv-dtype", "f32")
			defer func() { require.NoError(t, stop()) }()
			resp, err := http.Post(url+"/generate", "application/json",
				strings.NewReader(`{"input_ids": [3, 1, 4, 1, 5], "sampling_params": {"max_new_tokens": 32, "temperature": 0, "ignore_eos": true}}`))
			require.NoError(t, err)
			var g struct {
				IDs []int32 `json:"output_ids"`
			}
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&g))
			resp.Body.Close()
			require.Equal(t, want[len(prompt):], g.IDs)
		})
	}
	http.DefaultClient.CloseIdleConnections()
}
