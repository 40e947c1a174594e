package serve_test

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/model"
	"github.com/moex-project/moex/serve"
)

var (
	benchPreset = flag.String("serve-preset", "tiny", "the serving benchmarks' preset: tiny or deepseek-v2-lite")
	benchLayers = flag.Int("serve-layers", 1, "deepseek-v2-lite: decoder layers")
	benchStream = flag.Int("serve-stream-interval", 1, "the server's stream interval (tokens a frame)")
)

func benchModel(b *testing.B) *model.Model {
	p := model.Tiny()
	if *benchPreset == "deepseek-v2-lite" {
		p = model.DeepSeekV2Lite(*benchLayers)
	}
	m, err := model.NewRandom(p, 1)
	require.NoError(b, err)
	return m
}

// benchServer serves m on a loopback port.
func benchServer(b *testing.B, m *model.Model, o serve.Options) (url string, stop func()) {
	kv, err := m.NewKV(1024, 16, kernels.BF16)
	require.NoError(b, err)
	s, err := serve.New(m, kv, o)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.Run(ctx) })
	srv := httptest.NewServer(serve.NewServer(s, serve.Byte{}, nil, serve.Info{ModelPath: "bench", StreamInterval: *benchStream}).Handler())
	return srv.URL, func() { srv.Close(); cancel(); wg.Wait() }
}

// stream sends ids for n tokens and returns the times its first and last
// frames came and the tokens the first held.
func stream(url string, ids []int32, n int) (first, last time.Time, firstN int, err error) {
	body, _ := json.Marshal(map[string]any{"input_ids": ids, "stream": true,
		"sampling_params": map[string]any{"max_new_tokens": n, "temperature": 0, "ignore_eos": true}})
	resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return first, last, 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	got := 0
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var f struct {
			OutputIDs []int32 `json:"output_ids"`
		}
		if err := json.Unmarshal([]byte(data), &f); err != nil {
			return first, last, 0, err
		}
		if len(f.OutputIDs) > got {
			if got == 0 {
				first, firstN = time.Now(), len(f.OutputIDs)
			}
			got, last = len(f.OutputIDs), time.Now()
		}
	}
	if got != n {
		return first, last, firstN, fmt.Errorf("%d of %d tokens", got, n)
	}
	return first, last, firstN, nil
}

// BenchmarkDecodeBatch16: sixteen requests decoding together, through the
// HTTP server streamed (timed by the clients from first to last token) and
// not streamed (the time of 33 tokens less that of one, over 32 steps), and
// as bare model.Forward steps of the same sixteen sequences, in one run;
// overhead-% is the streamed step's time over the bare step's, less one,
// unstreamed-overhead-% the unstreamed step's.
//
//	go test ./serve -run '^$' -bench DecodeBatch16 [-args -serve-preset deepseek-v2-lite -serve-layers 1]
func BenchmarkDecodeBatch16(b *testing.B) {
	const batch, prompt, out = 16, 64, 33
	m := benchModel(b)
	prompts := make([][]int32, batch)
	for i := range prompts {
		prompts[i] = moetest.Tokens(uint64(i+1), prompt, model.ByteVocab)
	}
	url, stop := benchServer(b, m, serve.Options{Budget: batch * prompt, NoPrefixCache: true})
	defer stop()
	var server, whole, bare time.Duration
	unstreamed := func(n int) time.Duration {
		var wg sync.WaitGroup
		start := time.Now()
		for i := range prompts {
			wg.Go(func() {
				body, _ := json.Marshal(map[string]any{"input_ids": prompts[i],
					"sampling_params": map[string]any{"max_new_tokens": n, "temperature": 0, "ignore_eos": true}})
				resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(string(body)))
				require.NoError(b, err)
				resp.Body.Close()
				require.Equal(b, http.StatusOK, resp.StatusCode)
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	for b.Loop() {
		// Through the server.
		var wg sync.WaitGroup
		steps := make([]time.Duration, batch)
		errs := make([]error, batch)
		for i := range prompts {
			wg.Go(func() {
				first, last, firstN, err := stream(url, prompts[i], out)
				steps[i], errs[i] = last.Sub(first)/time.Duration(max(out-firstN, 1)), err
			})
		}
		wg.Wait()
		for i := range errs {
			require.NoError(b, errs[i])
			server += steps[i] / batch
		}
		whole += (unstreamed(out) - unstreamed(1)) / (out - 1)
		// Bare steps.
		kv, err := m.NewKV(1024, 16, kernels.BF16)
		require.NoError(b, err)
		var seqs []int
		var ids []int32
		for i, p := range prompts {
			for range p {
				seqs = append(seqs, i)
			}
			ids = append(ids, p...)
		}
		_, err = m.Forward(context.Background(), kv, seqs, ids, nil)
		require.NoError(b, err)
		dec, next := make([]int, batch), make([]int32, batch)
		for i := range dec {
			dec[i], next[i] = i, int32(i)
		}
		start := time.Now()
		for range out - 1 {
			if _, err := m.Forward(context.Background(), kv, dec, next, nil); err != nil {
				b.Fatal(err)
			}
		}
		bare += time.Since(start) / (out - 1)
	}
	n := float64(b.N)
	b.ReportMetric(server.Seconds()*1e3/n, "server-ms/step")
	b.ReportMetric(bare.Seconds()*1e3/n, "bare-ms/step")
	b.ReportMetric(100*(server.Seconds()/bare.Seconds()-1), "overhead-%")
	b.ReportMetric(100*(whole.Seconds()/bare.Seconds()-1), "unstreamed-overhead-%")
	b.ReportMetric(batch*n/server.Seconds(), "server-decode-tok/s")
}

// BenchmarkPrefixTTFT: the time to first token of a request whose
// 1024-token prefix is in the prefix cache, against the same request with
// the cache flushed, through the HTTP server, one at a time, in one run.
//
//	go test ./serve -run '^$' -bench PrefixTTFT
func BenchmarkPrefixTTFT(b *testing.B) {
	m := benchModel(b)
	url, stop := benchServer(b, m, serve.Options{Budget: 512})
	defer stop()
	system := moetest.Tokens(1, 1024, model.ByteVocab)
	var cached, uncached time.Duration
	for i := 0; b.Loop(); i++ {
		ids := append(append([]int32(nil), system...), moetest.Tokens(uint64(100+i), 16, model.ByteVocab)...)
		resp, err := http.Post(url+"/flush_cache", "", nil)
		require.NoError(b, err)
		resp.Body.Close()
		require.Equal(b, http.StatusOK, resp.StatusCode)
		t0 := time.Now()
		first, _, _, err := stream(url, ids, 1)
		require.NoError(b, err)
		uncached += first.Sub(t0)
		ids[len(ids)-1]++ // another question, the same system prompt
		t0 = time.Now()
		first, _, _, err = stream(url, ids, 1)
		require.NoError(b, err)
		cached += first.Sub(t0)
	}
	n := float64(b.N)
	b.ReportMetric(uncached.Seconds()*1e3/n, "uncached-ms")
	b.ReportMetric(cached.Seconds()*1e3/n, "cached-ms")
	b.ReportMetric(cached.Seconds()/uncached.Seconds(), "cached/uncached")
}
