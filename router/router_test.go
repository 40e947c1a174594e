package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fake is a worker: /generate answers its text back (streamed as three
// frames when asked), unless told to fail.
type fake struct {
	srv      *httptest.Server
	addr     string
	requests atomic.Int64
	fail     atomic.Int64 // status to answer /generate with (0: answer)
	healthy  atomic.Bool
	ids      sync.Map // request ids seen
	hold     chan struct{}
}

func newFake(t *testing.T) *fake {
	f := &fake{hold: make(chan struct{})}
	close(f.hold)
	f.healthy.Store(true)
	f.srv = httptest.NewServer(f.handler())
	f.addr = f.srv.Listener.Addr().String()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) url() string { return "http://" + f.addr }

func (f *fake) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if !f.healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("POST /flush_cache", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	mux.HandleFunc("GET /get_load", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"num_running_reqs": 0}`) })
	mux.HandleFunc("GET /get_model_info", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"model_path": "fake"}`) })
	handle := func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		f.ids.Store(r.Header.Get("X-Request-Id"), true)
		if s := f.fail.Load(); s != 0 {
			w.WriteHeader(int(s))
			fmt.Fprint(w, `{"error": {"message": "failing"}}`)
			return
		}
		var body struct {
			Text   string `json:"text"`
			Stream bool   `json:"stream"`
		}
		json.NewDecoder(r.Body).Decode(&body)
		select {
		case <-f.hold:
		case <-r.Context().Done():
			return
		}
		if !body.Stream {
			json.NewEncoder(w).Encode(map[string]any{"text": body.Text, "worker": f.addr})
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"text\": %q, \"i\": %d}\n\n", body.Text, i)
			w.(http.Flusher).Flush()
			select {
			case <-time.After(5 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
	mux.HandleFunc("POST /generate", handle)
	mux.HandleFunc("POST /v1/completions", handle)
	return mux
}

func testConfig(policy string) Config {
	c := Defaults()
	c.Policy = policy
	c.HealthInterval, c.HealthTimeout = 20*time.Millisecond, 200*time.Millisecond
	c.StartupTimeout = 2 * time.Second
	c.BackoffInitial, c.BackoffMax = time.Millisecond, 5*time.Millisecond
	c.BreakerFailures = 0
	return c
}

// startRouter serves r on a loopback port with its background loop.
func startRouter(t *testing.T, r *Router, fakes ...*fake) (string, func()) {
	for _, f := range fakes {
		require.NoError(t, r.AddWorker(context.Background(), f.url()))
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx) })
	srv := httptest.NewServer(r.Handler())
	return srv.URL, func() {
		srv.Close()
		cancel()
		wg.Wait()
		r.client.CloseIdleConnections()
		http.DefaultClient.CloseIdleConnections()
	}
}

func post(t *testing.T, u, path, body string, header ...string) (*http.Response, string) {
	req, _ := http.NewRequest(http.MethodPost, u+path, strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestProxy: requests pass through (streams frame by frame), request ids
// are honoured or made and echoed, the same prefix goes to the same
// worker, /flush_cache fans out and clears the tree, the admin API adds and
// removes workers, and every load counter is back at zero.
func TestProxy(t *testing.T) {
	a, b := newFake(t), newFake(t)
	r, err := New(testConfig("cache_aware"))
	require.NoError(t, err)
	u, stop := startRouter(t, r, a, b)
	defer stop()

	resp, body := post(t, u, "/generate", `{"text": "hello there, a long enough shared prefix"}`, "X-Request-Id", "mine-1")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "mine-1", resp.Header.Get("X-Request-Id"))
	var got struct{ Text, Worker string }
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.Equal(t, "hello there, a long enough shared prefix", got.Text)
	first := got.Worker
	for i := range 5 {
		resp, body = post(t, u, "/generate", fmt.Sprintf(`{"text": "hello there, a long enough shared prefix %d"}`, i))
		require.NoError(t, json.Unmarshal([]byte(body), &got))
		require.Equal(t, first, got.Worker, "the cached prefix's worker")
		require.True(t, strings.HasPrefix(resp.Header.Get("X-Request-Id"), "req-"))
	}
	_, ok := a.ids.Load("mine-1")
	_, ok2 := b.ids.Load("mine-1")
	require.True(t, ok || ok2, "the id went upstream")

	// A stream: frames pass through as they come, [DONE] last.
	resp, err = http.Post(u+"/generate", "application/json", strings.NewReader(`{"text": "s", "stream": true}`))
	require.NoError(t, err)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	sc := bufio.NewScanner(resp.Body)
	var frames []string
	for sc.Scan() {
		if f, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			frames = append(frames, f)
		}
	}
	resp.Body.Close()
	require.Len(t, frames, 4)
	require.Equal(t, "[DONE]", frames[3])

	// GET routes go to a worker.
	gresp, err := http.Get(u + "/get_model_info")
	require.NoError(t, err)
	gb, _ := io.ReadAll(gresp.Body)
	gresp.Body.Close()
	require.JSONEq(t, `{"model_path": "fake"}`, string(gb))

	// Flush: every worker, and the tree forgets them.
	bytes, _ := r.tree.Size()
	require.Positive(t, bytes)
	resp, body = post(t, u, "/flush_cache", "")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	bytes, _ = r.tree.Size()
	require.Zero(t, bytes)

	// Admin: a third worker, listed, removed by its escaped URL.
	c := newFake(t)
	resp, body = post(t, u, "/workers", fmt.Sprintf(`{"url": %q}`, c.url()))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, c.url())
	resp, body = post(t, u, "/workers", fmt.Sprintf(`{"url": %q}`, c.url()))
	require.Equal(t, http.StatusConflict, resp.StatusCode, body)
	resp, body = post(t, u, "/workers", `{"url": "ftp://x"}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	req, _ := http.NewRequest(http.MethodDelete, u+"/workers/"+url.PathEscape(c.url()), nil)
	dresp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	db, _ := io.ReadAll(dresp.Body)
	dresp.Body.Close()
	require.Equal(t, http.StatusOK, dresp.StatusCode, string(db))
	require.NotContains(t, string(db), c.url())
	require.Len(t, r.Workers(), 2)
	req, _ = http.NewRequest(http.MethodDelete, u+"/workers?url="+url.QueryEscape(c.url()), nil)
	dresp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	dresp.Body.Close()
	require.Equal(t, http.StatusNotFound, dresp.StatusCode)

	lresp, err := http.Get(u + "/get_loads")
	require.NoError(t, err)
	lb, _ := io.ReadAll(lresp.Body)
	lresp.Body.Close()
	require.Contains(t, string(lb), `"worker_load":{"num_running_reqs":0}`)
	for _, w := range r.Workers() {
		require.Zero(t, w.Load())
	}
	mresp, err := http.Get(u + "/metrics")
	require.NoError(t, err)
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	for _, line := range []string{
		`moex_router_requests_total{policy="cache_aware",route="/generate",status="200"} 7`,
		`moex_router_decisions_total{decision="hit"} 5`,
		`moex_router_decisions_total{decision="miss"} 2`,
		"moex_router_tree_bytes 0",
	} {
		require.Contains(t, string(mb), line)
	}
}

// TestRetries: a worker answering 503 or refusing connections: the
// request goes to another; when every worker fails the client gets the
// last error naming the attempts; the counters end at zero.
func TestRetries(t *testing.T) {
	a, b := newFake(t), newFake(t)
	a.fail.Store(http.StatusServiceUnavailable)
	r, err := New(testConfig("round_robin"))
	require.NoError(t, err)
	u, stop := startRouter(t, r, a, b)
	defer stop()
	for i := range 6 {
		resp, body := post(t, u, "/generate", fmt.Sprintf(`{"text": "t%d"}`, i))
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.Contains(t, body, b.addr)
	}
	require.Positive(t, a.requests.Load())
	b.fail.Store(http.StatusInternalServerError)
	resp, body := post(t, u, "/generate", `{"text": "x"}`)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	require.Contains(t, body, "the request failed on 2 workers")
	b.fail.Store(http.StatusBadRequest) // not retried: the client's fault
	resp, _ = post(t, u, "/generate", `{"text": "x"}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	b.fail.Store(0)
	a.srv.Close() // connections refused
	for i := range 4 {
		resp, body := post(t, u, "/generate", fmt.Sprintf(`{"text": "u%d"}`, i))
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
	}
	for _, w := range r.Workers() {
		require.Zero(t, w.Load())
	}
}

// TestDisconnects: clients that go away mid-stream and upstream streams
// that break leave every load counter at zero.
func TestDisconnects(t *testing.T) {
	a, b := newFake(t), newFake(t)
	r, err := New(testConfig("least_load"))
	require.NoError(t, err)
	u, stop := startRouter(t, r, a, b)
	defer stop()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u+"/generate", strings.NewReader(fmt.Sprintf(`{"text": "d%d", "stream": true}`, i)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			br := bufio.NewReader(resp.Body)
			br.ReadString('\n') // the first frame, then gone
			if i%2 == 0 {
				cancel()
			}
			resp.Body.Close()
		})
	}
	wg.Wait()
	// An upstream that breaks mid-stream.
	a.srv.CloseClientConnections()
	require.Eventually(t, func() bool { return r.Workers()[0].Load() == 0 && r.Workers()[1].Load() == 0 }, 2*time.Second, time.Millisecond)
}

// TestHealth: a worker that stops answering is taken out after the
// failure threshold (its requests go elsewhere, its marks leave the tree)
// and brought back when it answers again; /readiness follows.
func TestHealth(t *testing.T) {
	a, b := newFake(t), newFake(t)
	r, err := New(testConfig("cache_aware"))
	require.NoError(t, err)
	u, stop := startRouter(t, r, a, b)
	defer stop()
	r.tree.Insert([]byte("a's prompt"), a.url())
	a.healthy.Store(false)
	require.Eventually(t, func() bool { return !r.Workers()[0].Healthy() }, 2*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return r.tree.WorkerBytes(a.url()) == 0 }, time.Second, time.Millisecond)
	for i := range 4 {
		_, body := post(t, u, "/generate", fmt.Sprintf(`{"text": "a's prompt %d"}`, i))
		require.Contains(t, body, b.addr)
	}
	a.healthy.Store(true)
	require.Eventually(t, func() bool { return r.Workers()[0].Healthy() }, 2*time.Second, 5*time.Millisecond)
	b.healthy.Store(false)
	a.healthy.Store(false)
	require.Eventually(t, func() bool {
		resp, err := http.Get(u + "/readiness")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	}, 2*time.Second, 5*time.Millisecond)
	resp, body := post(t, u, "/generate", `{"text": "nobody"}`)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Contains(t, body, "no healthy worker")
}

// TestKilledWorker: a worker killed mid-run (its listener and connections
// gone at once) loses no request that had not started: each goes to the
// other worker; it is taken out, and re-admitted when it listens again on
// its address.
func TestKilledWorker(t *testing.T) {
	a, b := newFake(t), newFake(t)
	r, err := New(testConfig("round_robin"))
	require.NoError(t, err)
	u, stop := startRouter(t, r, a, b)
	defer stop()
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	for i := range 60 {
		wg.Go(func() {
			resp, body := post(t, u, "/generate", fmt.Sprintf(`{"text": "k%d"}`, i))
			if resp.StatusCode == http.StatusOK && strings.Contains(body, fmt.Sprintf(`"k%d"`, i)) {
				ok.Add(1)
			} else {
				failed.Add(1)
			}
		})
		if i == 20 {
			a.srv.Listener.Close()
			a.srv.CloseClientConnections()
		}
	}
	wg.Wait()
	require.Zero(t, failed.Load())
	require.Equal(t, int64(60), ok.Load())
	require.Eventually(t, func() bool { return !r.Workers()[0].Healthy() }, 2*time.Second, 5*time.Millisecond)
	// It comes back on its address.
	ln, err := net.Listen("tcp", a.addr)
	require.NoError(t, err)
	back := &http.Server{Handler: a.handler()}
	go back.Serve(ln)
	defer back.Close()
	require.Eventually(t, func() bool { return r.Workers()[0].Healthy() }, 2*time.Second, 5*time.Millisecond)
	before := a.requests.Load()
	for i := range 4 {
		resp, _ := post(t, u, "/generate", fmt.Sprintf(`{"text": "again %d"}`, i))
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.Positive(t, a.requests.Load()-before, "round robin reaches it again")
}

// TestBreakerOpens: a worker failing requests (though its /health passes) has
// its circuit opened, and gets none until the timeout.
func TestBreakerOpens(t *testing.T) {
	a, b := newFake(t), newFake(t)
	cfg := testConfig("round_robin")
	cfg.BreakerFailures, cfg.BreakerSuccesses, cfg.BreakerTimeout = 2, 1, time.Hour
	r, err := New(cfg)
	require.NoError(t, err)
	u, stop := startRouter(t, r, a, b)
	defer stop()
	a.fail.Store(http.StatusBadGateway)
	for i := range 10 {
		resp, _ := post(t, u, "/generate", fmt.Sprintf(`{"text": "b%d"}`, i))
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.Equal(t, "open", r.Workers()[0].breaker.State())
	require.Equal(t, int64(2), a.requests.Load(), "two failures, then no more")
}

func TestConfigErrors(t *testing.T) {
	for _, tt := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Threshold = 2 }, "cache threshold 2"},
		{func(c *Config) { c.BalanceRel = 0.5 }, "balance thresholds"},
		{func(c *Config) { c.Policy = "fastest" }, `unknown policy "fastest"`},
		{func(c *Config) { c.Retries = -1 }, "-1 retries"},
		{func(c *Config) { c.HealthFailures = 0 }, "health thresholds"},
		{func(c *Config) { c.MaxTreeBytes = 0 }, "tree budget"},
	} {
		c := Defaults()
		tt.mod(&c)
		_, err := New(c)
		require.ErrorContains(t, err, tt.want)
	}
	r, _ := New(Defaults())
	require.ErrorContains(t, r.AddWorker(context.Background(), "localhost:3000"), "want http(s)://host:port")
	require.ErrorContains(t, r.RemoveWorker("http://nowhere:1"), "no worker http://nowhere:1")
}

func TestRouteText(t *testing.T) {
	for _, tt := range []struct{ path, body, want string }{
		{"/generate", `{"text": "hi there"}`, "hi there"},
		{"/generate", `{"input_ids": [1, 22, 333]}`, "1 22 333"},
		{"/generate", `{"text": ["a", "b"]}`, "a b"},
		{"/v1/completions", `{"prompt": "p"}`, "p"},
		{"/v1/completions", `{"prompt": [[5, 6]]}`, "5 6"},
		{"/v1/chat/completions", `{"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": [{"type": "text", "text": "u1"}, {"type": "text", "text": "u2"}]}, {"role": "assistant", "content": "a"}]}`, "sys u1 u2 a"},
		{"/generate", `not json`, ""},
	} {
		require.Equal(t, tt.want, string(routeText(tt.path, []byte(tt.body))), tt.body)
	}
}

// TestChatText: with a ChatText renderer, chat requests are matched on the
// prompt it renders (what the workers tokenize), and on their contents
// when it cannot render one.
func TestChatText(t *testing.T) {
	a := newFake(t)
	cfg := testConfig("cache_aware")
	var calls atomic.Int32
	cfg.ChatText = func(body []byte) ([]byte, bool) {
		calls.Add(1)
		if strings.Contains(string(body), "unrenderable") {
			return nil, false
		}
		return []byte("<|im_start|>user\n" + strings.Repeat("x", 30) + "<|im_end|>"), true
	}
	r, err := New(cfg)
	require.NoError(t, err)
	u, stop := startRouter(t, r, a)
	defer stop()
	post(t, u, "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}]}`) // the fake answers 404: routing is what counts
	require.Equal(t, int32(1), calls.Load())
	rendered, _ := r.tree.Size()
	require.Equal(t, len("<|im_start|>user\n")+30+len("<|im_end|>"), rendered, "the tree holds the rendered prompt")
	post(t, u, "/v1/chat/completions", `{"messages": [{"role": "user", "content": "unrenderable"}]}`)
	after, _ := r.tree.Size()
	require.Equal(t, rendered+len("unrenderable"), after, "the contents, when the renderer refuses")
	post(t, u, "/generate", `{"text": "plain"}`)
	require.Equal(t, int32(2), calls.Load(), "only chat requests are rendered")
}
