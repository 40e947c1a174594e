package loadgen_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/loadgen"
	"github.com/moex-project/moex/model"
	"github.com/moex-project/moex/serve"
)

func TestDatasets(t *testing.T) {
	ps, err := loadgen.SharedPrefix(3, 4, 20, 5, 7, 0, 1)
	require.NoError(t, err)
	require.Len(t, ps, 12)
	byGroup := map[int][]string{}
	for _, p := range ps {
		require.Len(t, p.Text, 25)
		require.Equal(t, 7, p.OutputLen)
		byGroup[p.Group] = append(byGroup[p.Group], p.Text)
	}
	require.Len(t, byGroup, 3)
	for g, texts := range byGroup {
		require.Len(t, texts, 4, "group %d", g)
		for _, x := range texts {
			require.Equal(t, texts[0][:20], x[:20], "group %d shares its system prompt", g)
		}
	}
	require.NotEqual(t, byGroup[0][0][:20], byGroup[1][0][:20])
	again, _ := loadgen.SharedPrefix(3, 4, 20, 5, 7, 0, 1)
	require.Equal(t, ps, again, "the seed fixes it")
	// Zipf: the same count, the first groups hottest.
	zs, err := loadgen.SharedPrefix(8, 64, 4, 2, 1, 1.5, 2)
	require.NoError(t, err)
	count := make([]int, 8)
	for _, p := range zs {
		count[p.Group]++
	}
	require.Len(t, zs, 512)
	require.Greater(t, count[0], count[7]*3, "%v", count)

	rs, err := loadgen.Random(50, 40, 10, 0.5, 3)
	require.NoError(t, err)
	for _, p := range rs {
		require.GreaterOrEqual(t, len(p.Text), 20)
		require.LessOrEqual(t, len(p.Text), 40)
		require.GreaterOrEqual(t, p.OutputLen, 5)
		require.LessOrEqual(t, p.OutputLen, 10)
	}
	for _, tt := range []struct {
		err  error
		want string
	}{
		{second(loadgen.SharedPrefix(0, 4, 1, 1, 1, 0, 1)), "0 groups of 4 prompts"},
		{second(loadgen.SharedPrefix(1, 1, 1, 0, 1, 0, 1)), "questions of 0"},
		{second(loadgen.SharedPrefix(1, 1, 1, 1, 0, 0, 1)), "output length 0"},
		{second(loadgen.SharedPrefix(1, 1, 1, 1, 1, 0.5, 1)), "zipf exponent 0.5 must be > 1"},
		{second(loadgen.SharedPrefix(1<<20, 1<<20, 1, 1, 1, 0, 1)), "too many"},
		{second(loadgen.Random(0, 1, 1, 1, 1)), "0 prompts"},
		{second(loadgen.Random(1, 1, 1, 2, 1)), "range ratio 2"},
	} {
		require.ErrorContains(t, tt.err, tt.want)
	}
}

func second[T any](_ T, err error) error { return err }

// TestRunMeasures: against a fake server that streams three tokens a
// request 5 ms apart and allows counting what is in flight, a run keeps to
// its concurrency, counts tokens from the final frames, and times them;
// errors and a server gone are failures with their messages.
func TestRunMeasures(t *testing.T) {
	var inFlight, most atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		var body struct {
			Text string `json:"text"`
		}
		json.NewDecoder(r.Body).Decode(&body)
		if strings.HasPrefix(body.Text, "bad") {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error": {"message": "bad prompt"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		ids := []int{}
		for i := range 3 {
			time.Sleep(5 * time.Millisecond)
			ids = append(ids, i)
			b, _ := json.Marshal(ids)
			fmt.Fprintf(w, "data: {\"output_ids\": %s, \"meta_info\": {\"completion_tokens\": %d}}\n\n", b, len(ids))
			w.(http.Flusher).Flush()
		}
		fmt.Fprintf(w, "data: {\"output_ids\": [0,1,2], \"meta_info\": {\"prompt_tokens\": %d, \"completion_tokens\": 3, \"cached_tokens\": 2, \"finish_reason\": {\"type\": \"length\"}}}\n\ndata: [DONE]\n\n", len(body.Text))
	}))
	defer srv.Close()
	prompts := make([]loadgen.Prompt, 10)
	for i := range prompts {
		prompts[i] = loadgen.Prompt{Text: "prompt", OutputLen: 3}
	}
	prompts[9].Text = "bad one"
	rep, err := loadgen.Run(context.Background(), loadgen.Config{URL: srv.URL, Concurrency: 3}, prompts)
	require.NoError(t, err)
	require.LessOrEqual(t, most.Load(), int32(3))
	require.Equal(t, 10, rep.Requests)
	require.Equal(t, 9, rep.Completed)
	require.Equal(t, 1, rep.Failed)
	require.Contains(t, rep.Errors[0], `HTTP 400: {"error": {"message": "bad prompt"}}`)
	require.Equal(t, 27, rep.OutputTokens)
	require.Equal(t, 9*6, rep.InputTokens)
	require.InDelta(t, 2.0/6, rep.HitRate, 1e-12)
	require.GreaterOrEqual(t, rep.TTFT.P50, 5.0, "the first token comes after 5 ms")
	require.GreaterOrEqual(t, rep.ITL.P50, 4.0)
	require.GreaterOrEqual(t, rep.E2E.P99, rep.E2E.P50)
	var out strings.Builder
	rep.Write(&out)
	require.Contains(t, out.String(), "requests: 9 completed, 1 failed")
	require.Contains(t, out.String(), "hit rate 33.3 %")

	srv.Close()
	rep, err = loadgen.Run(context.Background(), loadgen.Config{URL: srv.URL, Rate: 1000}, prompts[:2])
	require.NoError(t, err)
	require.Equal(t, 2, rep.Failed)
	require.Contains(t, rep.Errors[0], "connect")
	_, err = loadgen.Run(context.Background(), loadgen.Config{URL: "localhost:1"}, prompts)
	require.ErrorContains(t, err, `url "localhost:1" must begin with http://`)
	_, err = loadgen.Run(context.Background(), loadgen.Config{URL: srv.URL, Concurrency: -1}, prompts)
	require.ErrorContains(t, err, "concurrency -1")
}

// TestAgainstServe: the shared-prefix dataset sent at once to a worker on
// the tiny preset: every request completes with its output length, and the
// prompts after each group's first find the group's system prompt cached
// (whole blocks of it).
func TestAgainstServe(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 1)
	require.NoError(t, err)
	kv, err := m.NewKV(128, 16, kernels.BF16)
	require.NoError(t, err)
	s, err := serve.New(m, kv, serve.Options{Budget: 256})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	srv := httptest.NewServer(serve.NewServer(s, serve.Byte{}, []int32{serve.EOS}, serve.Info{ModelPath: "tiny", DPSize: 1}).Handler())
	defer srv.Close()
	prompts, err := loadgen.SharedPrefix(4, 4, 48, 8, 4, 0, 5)
	require.NoError(t, err)
	rep, err := loadgen.Run(context.Background(), loadgen.Config{URL: srv.URL}, prompts)
	require.NoError(t, err)
	require.Equal(t, 16, rep.Completed, "%v", rep.Errors)
	require.Equal(t, 16*4, rep.OutputTokens)
	require.Equal(t, 16*56, rep.InputTokens)
	require.Equal(t, 12*48, rep.CachedTokens, "three of each group's four find its 48-token system prompt")
}
