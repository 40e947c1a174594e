package router

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkRouterOverhead: the router's own cost, in front of four
// workers that answer at once: the median latency a request gains through
// it (sequential requests, against the same requests sent to the workers
// directly), and the requests per second it passes with 64 clients at
// once, in one run.
//
//	go test ./router -run '^$' -bench RouterOverhead -benchtime 3x
func BenchmarkRouterOverhead(b *testing.B) {
	var workers []*httptest.Server
	for range 4 {
		workers = append(workers, httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			if r.URL.Path == "/health" {
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"text": "ok", "meta_info": {"completion_tokens": 1}}`)
		})))
	}
	defer func() {
		for _, w := range workers {
			w.Close()
		}
	}()
	r, err := New(Defaults())
	require.NoError(b, err)
	for _, w := range workers {
		require.NoError(b, r.AddWorker(context.Background(), w.URL))
	}
	front := httptest.NewServer(r.Handler())
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	send := func(u string, i int) time.Duration {
		t0 := time.Now()
		resp, err := client.Post(u+"/generate", "application/json",
			strings.NewReader(fmt.Sprintf(`{"text": "a system prompt shared by a group of requests, then question %d"}`, i)))
		require.NoError(b, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(b, http.StatusOK, resp.StatusCode)
		return time.Since(t0)
	}
	median := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	const seq, conc, total = 2000, 64, 20000
	var added, direct, routed float64
	for b.Loop() {
		var viaRouter, viaDirect []time.Duration
		for i := range seq {
			viaDirect = append(viaDirect, send(workers[i%4].URL, i))
			viaRouter = append(viaRouter, send(front.URL, i))
		}
		added += float64(median(viaRouter)-median(viaDirect)) / 1e6
		rate := func(u func(i int) string) float64 {
			var next atomic.Int64
			var wg sync.WaitGroup
			t0 := time.Now()
			for range conc {
				wg.Go(func() {
					for i := int(next.Add(1)); i <= total; i = int(next.Add(1)) {
						send(u(i), i)
					}
				})
			}
			wg.Wait()
			return total / time.Since(t0).Seconds()
		}
		direct += rate(func(i int) string { return workers[i%4].URL })
		routed += rate(func(int) string { return front.URL })
	}
	n := float64(b.N)
	b.ReportMetric(added/n, "added-p50-ms")
	b.ReportMetric(routed/n, "router-req/s")
	b.ReportMetric(direct/n, "direct-req/s")
	client.CloseIdleConnections()
	r.client.CloseIdleConnections()
}
