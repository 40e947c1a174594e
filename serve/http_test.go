package serve_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/model"
	"github.com/moex-project/moex/serve"
)

type generated struct {
	Text      string  `json:"text"`
	OutputIDs []int32 `json:"output_ids"`
	Meta      struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		FinishReason     struct {
			Type string `json:"type"`
		} `json:"finish_reason"`
	} `json:"meta_info"`
}

func post(t *testing.T, url, body string) (*http.Response, []byte) {
	resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// TestHTTP: /generate non-streaming and streaming give the greedy chain of
// the prompt's bytes, the streamed frames' text cumulative and ending with
// [DONE]; bad requests are 400s naming the field and the server keeps
// serving; a client that goes away frees its blocks; no goroutine is left.
func TestHTTP(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 6)
	require.NoError(t, err)
	_, err = m.Prefill(context.Background(), []int32{1})
	require.NoError(t, err)
	before := runtime.NumGoroutine()
	s, kv, cancel, wg := start(t, m, 32, 16, serve.Options{Budget: 64})
	srv := httptest.NewServer(serve.NewServer(s, serve.Byte{}, []int32{serve.EOS}, serve.Info{ModelPath: "tiny", DPSize: 1}).Handler())

	prompt := "The quick brown fox"
	promptIDs, _ := serve.Byte{}.Encode(prompt)
	want := greedy(t, m, promptIDs, 6)
	resp, body := post(t, srv.URL, fmt.Sprintf(`{"text": %q, "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": true}}`, prompt))
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var g generated
	require.NoError(t, json.Unmarshal(body, &g))
	require.Equal(t, want, g.OutputIDs)
	require.Equal(t, serve.Byte{}.Decode(want), g.Text)
	require.Equal(t, len(prompt), g.Meta.PromptTokens)
	require.Equal(t, 6, g.Meta.CompletionTokens)
	require.Equal(t, "length", g.Meta.FinishReason.Type)

	// Streaming: a frame a token, cumulative, then [DONE].
	frames := events(t, srv.URL, "/generate",
		fmt.Sprintf(`{"text": %q, "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": true}, "stream": true}`, prompt))
	require.Equal(t, "[DONE]", frames[len(frames)-1])
	require.Len(t, frames, 6+2) // six tokens, the final frame, [DONE]
	for i, f := range frames[:6] {
		var g generated
		require.NoError(t, json.Unmarshal([]byte(f), &g))
		require.Equal(t, want[:i+1], g.OutputIDs)
		// A trailing character whose bytes may still be arriving is held back.
		require.Equal(t, strings.TrimRight(serve.Byte{}.Decode(want[:i+1]), "\uFFFD"), g.Text)
	}

	// input_ids and the token ids given: the same chain.
	ids, _ := json.Marshal(promptIDs)
	resp, body = post(t, srv.URL, fmt.Sprintf(`{"input_ids": %s, "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": true}}`, ids))
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.NoError(t, json.Unmarshal(body, &g))
	require.Equal(t, want, g.OutputIDs)

	for _, tt := range []struct{ body, want string }{
		{`{"text": "a", `, "the body is not a /generate request"},
		{`{"text": "a", "sampling_params": {"max_new_tokens": -1}}`, "max_new_tokens -1 must be positive"},
		{`{"text": "a", "sampling_params": {"max_new_tokens": 100000}}`, "need 100001 cache rows; the cache holds 512"},
		{`{"text": ""}`, "empty prompt"},
		{`{"input_ids": [1, 999]}`, "prompt token 1 is id 999, outside the vocabulary [0, 260)"},
		{`{"text": "a", "sampling_params": {"temperature": -1}}`, "temperature -1 must be a finite number"},
		{`{"text": "a", "sampling_params": {"top_p": 0}}`, "top_p 0 must be in (0, 1]"},
		{`{"text": "a", "sampling_params": {"max_new_tokens": "many"}}`, "the body is not a /generate request"},
		{`{"text": "a", "input_ids": [1]}`, "give text or input_ids, not both"},
		{`{}`, "text or input_ids is required"},
		{`{"text": "a", "extra": 1}`, `unknown field \"extra\"`},
	} {
		resp, body := post(t, srv.URL, tt.body)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, tt.body)
		require.Contains(t, string(body), tt.want, tt.body)
	}

	// The metrics of the three requests served and the eleven refused.
	resp, err = http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{
		`moex_requests_total{status="ok"} 3`,
		`moex_requests_total{status="bad_request"} 11`,
		fmt.Sprintf("moex_prompt_tokens_total %d", 3*len(prompt)),
		"moex_generation_tokens_total 18",
		"moex_time_to_first_token_seconds_count 3",
		"moex_inter_token_latency_seconds_count 15",
		"moex_e2e_request_latency_seconds_count 3",
		"moex_num_running_reqs 0",
		"moex_cache_blocks_used 1", // the prompt's first block, kept by the prefix cache
		"moex_prefix_cache_blocks 1",
		"moex_cached_prompt_tokens_total 32",     // the second and third requests found it
		"moex_cache_hit_rate 0.5614035087719298", // 32 of 57
		"moex_cache_blocks_total 32",
	} {
		require.Contains(t, string(mb), line+"\n")
	}

	// A client that goes away: its request ends and its blocks come back.
	ctx, stop := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/generate", strings.NewReader(
		`{"text": "a long one", "sampling_params": {"max_new_tokens": 400, "ignore_eos": true}, "stream": true}`))
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	line, err := bufio.NewReader(resp.Body).ReadString('\n') // the first frame: it is running
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "data: "))
	stop()
	resp.Body.Close()
	require.Eventually(t, func() bool { return kv.FreeBlocks()+s.Stats().CachedBlocks == kv.NumBlocks() }, 5*time.Second, 5*time.Millisecond)
	resp, err = http.Post(srv.URL+"/flush_cache", "", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, kv.NumBlocks(), kv.FreeBlocks(), "flushed: every block free")

	// Many clients at once: none is lost.
	var clients sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		clients.Go(func() {
			resp, err := http.Post(srv.URL+"/generate", "application/json", strings.NewReader(
				fmt.Sprintf(`{"text": "client %d", "sampling_params": {"max_new_tokens": %d, "ignore_eos": true}, "stream": %v}`, i, 3+i%5, i%2 == 0)))
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"completion_tokens":`+fmt.Sprint(3+i%5)) {
				errs <- fmt.Errorf("client %d: %d %s", i, resp.StatusCode, b)
			}
		})
	}
	clients.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	resp, err = http.Get(srv.URL + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Get(srv.URL + "/v1/models")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.JSONEq(t, `{"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "moex", "max_model_len": 512}]}`, string(b))
	resp, err = http.Get(srv.URL + "/get_server_info")
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.JSONEq(t, `{"model_path": "tiny", "dp_size": 1, "max_total_num_tokens": 512, "stream_interval": 1}`, string(b))

	srv.Close()
	cancel()
	wg.Wait()
	noGoroutinesLeft(t, before)
}

// TestContextLength: a model made for 24 positions refuses a request
// whose prompt and new tokens pass them (400, naming the context), and a
// request that does not say how many tokens to make gets what is left of
// the context (here fewer than the default 128), as vLLM gives.
func TestContextLength(t *testing.T) {
	p := model.Tiny()
	p.Context = 24
	m, err := model.NewRandom(p, 6)
	require.NoError(t, err)
	_, err = m.Prefill(context.Background(), []int32{1})
	require.NoError(t, err)
	before := runtime.NumGoroutine()
	s, _, cancel, wg := start(t, m, 32, 16, serve.Options{Budget: 64})
	srv := httptest.NewServer(serve.NewServer(s, serve.Byte{}, nil, serve.Info{ModelPath: "tiny", ContextLength: 24}).Handler())

	prompt := "twenty-tokens prompt" // 20 bytes
	resp, body := post(t, srv.URL, fmt.Sprintf(`{"text": %q, "sampling_params": {"max_new_tokens": 5, "ignore_eos": true}}`, prompt))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(body))
	require.Contains(t, string(body), "the model's context is 24 tokens; the request asks for 25 (20 in the prompt, 5 new)")
	resp, body = post(t, srv.URL, fmt.Sprintf(`{"text": %q}`, strings.Repeat("x", 24)))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(body))
	require.Contains(t, string(body), "the model's context is 24 tokens")

	resp, body = post(t, srv.URL, fmt.Sprintf(`{"text": %q, "sampling_params": {"temperature": 0, "ignore_eos": true}}`, prompt))
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var g generated
	require.NoError(t, json.Unmarshal(body, &g))
	require.Equal(t, 4, g.Meta.CompletionTokens)
	ids, _ := serve.Byte{}.Encode(prompt)
	require.Equal(t, greedy(t, m, ids, 4), g.OutputIDs)

	srv.Close()
	cancel()
	wg.Wait()
	noGoroutinesLeft(t, before)
}

// noGoroutinesLeft waits up to two seconds for the goroutines to be back
// to before (the client's idle connections closed), else fails listing them.
func noGoroutinesLeft(t *testing.T, before int) {
	t.Helper()
	http.DefaultClient.CloseIdleConnections()
	for i := 0; runtime.NumGoroutine() > before && i < 200; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines left, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}
