package router

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moex-project/moex/internal/httpjson"
)

// Config is a router's settings; Defaults gives every field its default.
type Config struct {
	Policy string
	CacheAware
	MaxTreeBytes     int           // the tree's budget, bytes of text
	EvictionInterval time.Duration // the periodic eviction's

	HealthInterval   time.Duration // between health checks of each worker
	HealthTimeout    time.Duration // one check's limit
	HealthFailures   int           // consecutive failed checks that take a worker out
	HealthSuccesses  int           // consecutive passed checks that bring it back
	StartupTimeout   time.Duration // how long a new worker may take to answer /health
	Retries          int           // further attempts, each on another worker
	BackoffInitial   time.Duration
	BackoffMax       time.Duration
	BackoffFactor    float64
	BackoffJitter    float64 // ± this fraction of each wait
	BreakerFailures  int     // consecutive failed requests that open a worker's circuit (0: no breaker)
	BreakerSuccesses int     // consecutive successes that close it from half-open
	BreakerTimeout   time.Duration
	RoutingKeyHeader string // consistent_hash's key
	MaxBodyBytes     int64
	Seed             uint64
	Client           *http.Client // to the workers (nil: one with no overall timeout; streams last)
	// ChatText renders a /v1/chat/completions body into the prompt text
	// the workers will tokenize (the model's own chat template), so that
	// the tree matches what the workers' prefix caches hold; false when it
	// cannot (the request then routes on its messages' contents). Nil: the
	// contents, joined by spaces.
	ChatText func(body []byte) ([]byte, bool)
}

// Defaults are SGLang's 2026 gateway's where it has them (cache threshold
// 0.3, balance 64 / 1.5, eviction every 120 s, 3 retries from 50 ms ×1.5
// with 20 % jitter, health thresholds 3 / 2, breaker 10 / 3 / 60 s),
// shorter health intervals (10 s, not 60: a dead worker leaves within
// about 30 s), a spill gate of 16 / 1.2 (tighter than the balance pair, or
// it could never act), and a tree of 64 MiB of text.
func Defaults() Config {
	return Config{
		Policy:       "cache_aware",
		CacheAware:   CacheAware{Threshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5, SpillAbs: 16, SpillRel: 1.2},
		MaxTreeBytes: 64 << 20, EvictionInterval: 120 * time.Second,
		HealthInterval: 10 * time.Second, HealthTimeout: 5 * time.Second, HealthFailures: 3, HealthSuccesses: 2,
		StartupTimeout: 5 * time.Minute,
		Retries:        3, BackoffInitial: 50 * time.Millisecond, BackoffMax: 30 * time.Second, BackoffFactor: 1.5, BackoffJitter: 0.2,
		BreakerFailures: 10, BreakerSuccesses: 3, BreakerTimeout: 60 * time.Second,
		RoutingKeyHeader: "X-Routing-Key", MaxBodyBytes: 64 << 20,
	}
}

// Validate names a setting out of its range.
func (c Config) Validate() error {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !(c.Threshold >= 0 && c.Threshold <= 1):
		return fmt.Errorf("router: cache threshold %v must be in [0, 1]", c.Threshold)
	case !finite(c.BalanceAbs) || c.BalanceAbs < 0 || !finite(c.BalanceRel) || c.BalanceRel < 1:
		return fmt.Errorf("router: balance thresholds %v (abs, ≥ 0) and %v (rel, ≥ 1)", c.BalanceAbs, c.BalanceRel)
	case !finite(c.SpillAbs) || c.SpillAbs < 0 || !finite(c.SpillRel) || c.SpillRel < 1:
		return fmt.Errorf("router: spill thresholds %v (abs, ≥ 0) and %v (rel, ≥ 1)", c.SpillAbs, c.SpillRel)
	case c.MaxTreeBytes < 1:
		return fmt.Errorf("router: tree budget %d bytes must be positive", c.MaxTreeBytes)
	case c.EvictionInterval <= 0 || c.HealthInterval <= 0 || c.HealthTimeout <= 0 || c.StartupTimeout <= 0:
		return errors.New("router: the eviction and health-check intervals and the timeouts must be positive")
	case c.HealthFailures < 1 || c.HealthSuccesses < 1:
		return fmt.Errorf("router: health thresholds %d and %d must be positive", c.HealthFailures, c.HealthSuccesses)
	case c.Retries < 0 || c.Retries > 100:
		return fmt.Errorf("router: %d retries (want 0 to 100)", c.Retries)
	case c.BackoffInitial < 0 || c.BackoffMax < c.BackoffInitial || !(c.BackoffFactor >= 1) || !finite(c.BackoffFactor) || !(c.BackoffJitter >= 0 && c.BackoffJitter <= 1):
		return errors.New("router: backoff: initial ≥ 0, max ≥ initial, factor ≥ 1, jitter in [0, 1]")
	case c.BreakerFailures < 0 || c.BreakerSuccesses < 1 || c.BreakerTimeout <= 0:
		return errors.New("router: breaker: failures ≥ 0 (0: off), successes ≥ 1, timeout > 0")
	case c.MaxBodyBytes < 1:
		return errors.New("router: the body limit must be positive")
	}
	if !slices.Contains(Policies, c.Policy) {
		return fmt.Errorf("router: unknown policy %q (have %s)", c.Policy, strings.Join(Policies, ", "))
	}
	return nil
}

// Router proxies requests to its workers by its policy. Safe for
// concurrent use.
type Router struct {
	cfg     Config
	tree    *Tree
	policy  Policy
	client  *http.Client
	metrics *metrics

	mu      sync.RWMutex
	workers []*Worker

	jitter *lockedRand
}

// New makes a router with no workers yet.
func New(cfg Config) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tree := NewTree(cfg.MaxTreeBytes)
	p, err := NewPolicy(cfg.Policy, tree, cfg.CacheAware, cfg.Seed)
	if err != nil {
		return nil, err
	}
	r := &Router{cfg: cfg, tree: tree, policy: p, client: cfg.Client,
		jitter: &lockedRand{r: mrand.New(mrand.NewPCG(cfg.Seed, 0x6a6974))}}
	if r.client == nil {
		r.client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 256, IdleConnTimeout: 3 * time.Second}}
	}
	r.metrics = newMetrics(r)
	return r, nil
}

// Tree is the router's tree.
func (r *Router) Tree() *Tree { return r.tree }

// normalize checks a worker's URL and drops a trailing slash.
func normalize(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", fmt.Errorf("router: worker URL %q: want http(s)://host:port", raw)
	}
	return strings.TrimSuffix(raw, "/"), nil
}

// AddWorker adds the worker at rawURL once its /health answers 200, waiting
// up to the startup timeout (or ctx).
func (r *Router) AddWorker(ctx context.Context, rawURL string) error {
	u, err := normalize(rawURL)
	if err != nil {
		return err
	}
	r.mu.RLock()
	dup := slices.ContainsFunc(r.workers, func(w *Worker) bool { return w.URL == u })
	r.mu.RUnlock()
	if dup {
		return fmt.Errorf("router: worker %s is already there", u)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.StartupTimeout)
	defer cancel()
	for {
		err = r.check(ctx, u)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("router: worker %s did not answer /health within %v: %w", u, r.cfg.StartupTimeout, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	w := &Worker{URL: u}
	w.healthy.Store(true)
	w.breaker.init(r.cfg.BreakerFailures, r.cfg.BreakerSuccesses, r.cfg.BreakerTimeout)
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.ContainsFunc(r.workers, func(w *Worker) bool { return w.URL == u }) {
		return fmt.Errorf("router: worker %s is already there", u)
	}
	r.workers = append(r.workers, w)
	return nil
}

// RemoveWorker takes the worker at rawURL out, and its marks out of the
// tree; its requests in flight finish.
func (r *Router) RemoveWorker(rawURL string) error {
	u, err := normalize(rawURL)
	if err != nil {
		return err
	}
	r.mu.Lock()
	i := slices.IndexFunc(r.workers, func(w *Worker) bool { return w.URL == u })
	if i < 0 {
		r.mu.Unlock()
		return fmt.Errorf("router: no worker %s", u)
	}
	r.workers = slices.Delete(slices.Clone(r.workers), i, i+1)
	r.mu.Unlock()
	r.tree.RemoveWorker(u)
	return nil
}

// Workers is the registered workers, in order.
func (r *Router) Workers() []*Worker {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Clone(r.workers)
}

// check asks the worker's /health.
func (r *Router) check(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.HealthTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/health answered %d", resp.StatusCode)
	}
	return nil
}

// Run checks the workers' health and evicts from the tree, each at its
// interval, until ctx ends.
func (r *Router) Run(ctx context.Context) error {
	health := time.NewTicker(r.cfg.HealthInterval)
	defer health.Stop()
	evict := time.NewTicker(r.cfg.EvictionInterval)
	defer evict.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-evict.C:
			r.tree.Evict()
		case <-health.C:
			r.checkAll(ctx)
		}
	}
}

// checkAll checks every worker once, together: a worker failing
// HealthFailures checks in a row leaves the routing (and the tree), one
// passing HealthSuccesses in a row comes back. Health checks never touch
// the load counters.
func (r *Router) checkAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, w := range r.Workers() {
		wg.Go(func() {
			err := r.check(ctx, w.URL)
			if ctx.Err() != nil {
				return
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if err != nil {
				w.fails, w.oks = w.fails+1, 0
				if w.healthy.Load() && w.fails >= r.cfg.HealthFailures {
					w.healthy.Store(false)
					r.metrics.healthEvents.WithLabelValues(w.URL, "down").Inc()
					go r.tree.RemoveWorker(w.URL)
				}
				return
			}
			w.oks, w.fails = w.oks+1, 0
			if !w.healthy.Load() && w.oks >= r.cfg.HealthSuccesses {
				w.healthy.Store(true)
				r.metrics.healthEvents.WithLabelValues(w.URL, "up").Inc()
			}
		})
	}
	wg.Wait()
}

// eligible is the workers a request may go to: healthy, circuit not open,
// not tried yet.
func (r *Router) eligible(tried []*Worker) []*Worker {
	var out []*Worker
	for _, w := range r.Workers() {
		if w.healthy.Load() && !slices.Contains(tried, w) && w.breaker.allow() {
			out = append(out, w)
		}
	}
	return out
}

// retryable is whether an upstream status may be tried on another worker.
func retryable(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// backoff is the wait before retry n (0 the first), with jitter.
func (r *Router) backoff(n int) time.Duration {
	d := float64(r.cfg.BackoffInitial) * math.Pow(r.cfg.BackoffFactor, float64(n))
	d = min(d, float64(r.cfg.BackoffMax))
	if j := r.cfg.BackoffJitter; j > 0 {
		d *= 1 + j*(2*float64(r.jitter.IntN(1<<20))/float64(1<<20)-1)
	}
	return time.Duration(d)
}

// requestID is the client's x-request-id (or x-correlation-id), or a new
// one.
func requestID(h http.Header) string {
	for _, k := range []string{"X-Request-Id", "X-Correlation-Id"} {
		if v := h.Get(k); v != "" {
			return v
		}
	}
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, 24)
	rand.Read(b)
	for i := range b {
		b[i] = alnum[int(b[i])%len(alnum)]
	}
	return "req-" + string(b)
}

// Handler is the router's HTTP API.
func (r *Router) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, p := range []string{"/generate", "/v1/completions", "/v1/chat/completions"} {
		mux.HandleFunc("POST "+p, r.route)
	}
	for _, p := range []string{"/v1/models", "/get_model_info", "/get_server_info"} {
		mux.HandleFunc("GET "+p, r.route)
	}
	mux.HandleFunc("POST /flush_cache", r.flush)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /readiness", func(w http.ResponseWriter, _ *http.Request) {
		if len(r.eligible(nil)) == 0 {
			httpjson.Error(w, http.StatusServiceUnavailable, "no healthy worker")
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /get_loads", r.loads)
	mux.HandleFunc("GET /workers", r.listWorkers)
	mux.HandleFunc("POST /workers", r.addWorker)
	mux.HandleFunc("DELETE /workers/{url...}", r.deleteWorker)
	mux.HandleFunc("DELETE /workers", r.deleteWorker)
	mux.Handle("GET /metrics", r.metrics.handler())
	return mux
}

// route sends a request to a worker by the policy, retrying on another
// worker while no response has started.
func (r *Router) route(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	path := req.URL.Path
	id := requestID(req.Header)
	w.Header().Set("X-Request-Id", id)
	status := r.forward(w, req, path, id)
	r.metrics.requests.WithLabelValues(path, r.policy.Name(), fmt.Sprint(status)).Inc()
	r.metrics.duration.WithLabelValues(path).Observe(time.Since(start).Seconds())
}

// forward does route's work and returns the status the client got.
func (r *Router) forward(w http.ResponseWriter, req *http.Request, path, id string) int {
	var body []byte
	if req.Method == http.MethodPost {
		var err error
		body, err = io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBodyBytes))
		if err != nil {
			httpjson.Error(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is over %d bytes or unreadable: %v", r.cfg.MaxBodyBytes, err))
			return http.StatusRequestEntityTooLarge
		}
	}
	text := []byte(nil)
	if path == "/v1/chat/completions" && r.cfg.ChatText != nil {
		if t, ok := r.cfg.ChatText(body); ok {
			text = t
		}
	}
	if text == nil {
		text = routeText(path, body)
	}
	pr := &Request{Text: text, Key: req.Header.Get(r.cfg.RoutingKeyHeader)}
	var tried []*Worker
	lastErr := "no healthy worker"
	lastStatus := http.StatusServiceUnavailable
	for attempt := 0; attempt <= r.cfg.Retries; attempt++ {
		if attempt > 0 {
			r.metrics.retries.Inc()
			select {
			case <-req.Context().Done():
				return 499 // the client went away
			case <-time.After(r.backoff(attempt - 1)):
			}
		}
		ws := r.eligible(tried)
		if len(ws) == 0 {
			break
		}
		wk, decision := r.policy.Pick(pr, ws)
		if path == "/generate" || strings.HasPrefix(path, "/v1/c") {
			r.metrics.decisions.WithLabelValues(decision).Inc()
		}
		tried = append(tried, wk)
		done, status, err := r.try(w, req, wk, path, id, body)
		if done {
			return status
		}
		lastErr, lastStatus = fmt.Sprintf("worker %s: %v", wk.URL, err), status
		if req.Context().Err() != nil {
			return 499
		}
	}
	httpjson.Error(w, lastStatus, fmt.Sprintf("the request failed on %d workers; the last: %s", len(tried), lastErr))
	return lastStatus
}

// try sends the request to wk. done: the client has its answer (a response
// passed through, whole or streamed, or the client went away); otherwise
// the attempt failed before any response reached the client, with status
// and err saying how.
func (r *Router) try(w http.ResponseWriter, req *http.Request, wk *Worker, path, id string, body []byte) (done bool, status int, err error) {
	release := wk.acquire()
	defer release()
	wk.breaker.begin()
	defer wk.breaker.end()
	up, err := http.NewRequestWithContext(req.Context(), req.Method, wk.URL+path, bytes.NewReader(body))
	if err != nil {
		return false, http.StatusBadGateway, err
	}
	up.Header.Set("Content-Type", "application/json")
	up.Header.Set("X-Request-Id", id)
	if v := req.Header.Get("Accept"); v != "" {
		up.Header.Set("Accept", v)
	}
	sent := time.Now()
	resp, err := r.client.Do(up)
	if err != nil {
		if req.Context().Err() != nil {
			return true, 499, err
		}
		wk.breaker.record(false)
		return false, http.StatusBadGateway, err
	}
	defer resp.Body.Close()
	r.metrics.upstream.WithLabelValues(wk.URL).Observe(time.Since(sent).Seconds())
	if retryable(resp.StatusCode) {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode >= 500 {
			wk.breaker.record(false)
		}
		return false, resp.StatusCode, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	wk.breaker.record(true)
	for _, k := range []string{"Content-Type", "Cache-Control"} {
		if v := resp.Header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	first := true
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if first {
				r.metrics.ttfb.WithLabelValues(wk.URL).Observe(time.Since(sent).Seconds())
				first = false
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return true, resp.StatusCode, nil // the client went away: the upstream request is cancelled with it
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if rerr != nil {
			// io.EOF, or the upstream broke mid-response: the client has
			// what came (a stream's frames end without [DONE]).
			return true, resp.StatusCode, nil
		}
	}
}

// flush fans /flush_cache out to every healthy worker and clears their
// marks from the tree; it answers 200 when all did, else the first
// failure's status, listing each worker's answer.
func (r *Router) flush(w http.ResponseWriter, req *http.Request) {
	ws := r.eligible(nil)
	type result struct {
		Worker string `json:"worker"`
		Status int    `json:"status"`
		Body   string `json:"body,omitempty"`
	}
	results := make([]result, len(ws))
	var wg sync.WaitGroup
	for i, wk := range ws {
		wg.Go(func() {
			results[i].Worker = wk.URL
			up, _ := http.NewRequestWithContext(req.Context(), http.MethodPost, wk.URL+"/flush_cache", nil)
			resp, err := r.client.Do(up)
			if err != nil {
				results[i].Status, results[i].Body = http.StatusBadGateway, err.Error()
				return
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			results[i].Status = resp.StatusCode
			if resp.StatusCode != http.StatusOK {
				results[i].Body = string(bytes.TrimSpace(b))
				return
			}
			r.tree.RemoveWorker(wk.URL)
		})
	}
	wg.Wait()
	status := http.StatusOK
	for _, res := range results {
		if res.Status != http.StatusOK {
			status = res.Status
			break
		}
	}
	httpjson.Write(w, status, map[string]any{"workers": results})
}

// WorkerInfo is what /workers and /get_loads say of a worker.
type WorkerInfo struct {
	URL       string          `json:"url"`
	Healthy   bool            `json:"healthy"`
	Load      int64           `json:"load"`
	Processed int64           `json:"processed"`
	Circuit   string          `json:"circuit"`
	TreeBytes int             `json:"tree_bytes"`
	Worker    json.RawMessage `json:"worker_load,omitempty"` // its own /get_load
}

func (r *Router) info(wk *Worker) WorkerInfo {
	return WorkerInfo{URL: wk.URL, Healthy: wk.healthy.Load(), Load: wk.load.Load(), Processed: wk.processed.Load(),
		Circuit: wk.breaker.State(), TreeBytes: r.tree.WorkerBytes(wk.URL)}
}

func (r *Router) listWorkers(w http.ResponseWriter, _ *http.Request) {
	var out []WorkerInfo
	for _, wk := range r.Workers() {
		out = append(out, r.info(wk))
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"workers": out})
}

// loads is every worker's load as the router counts it, and its own
// /get_load.
func (r *Router) loads(w http.ResponseWriter, req *http.Request) {
	ws := r.Workers()
	out := make([]WorkerInfo, len(ws))
	var wg sync.WaitGroup
	for i, wk := range ws {
		out[i] = r.info(wk)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(req.Context(), r.cfg.HealthTimeout)
			defer cancel()
			up, _ := http.NewRequestWithContext(ctx, http.MethodGet, wk.URL+"/get_load", nil)
			resp, err := r.client.Do(up)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			if resp.StatusCode == http.StatusOK && json.Valid(b) {
				out[i].Worker = b
			}
		})
	}
	wg.Wait()
	httpjson.Write(w, http.StatusOK, map[string]any{"workers": out})
}

func (r *Router) addWorker(w http.ResponseWriter, req *http.Request) {
	u := req.URL.Query().Get("url")
	if u == "" {
		var b struct {
			URL string `json:"url"`
		}
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&b); err != nil || b.URL == "" {
			httpjson.Error(w, http.StatusBadRequest, `give the worker as {"url": "http://host:port"} or ?url=`)
			return
		}
		u = b.URL
	}
	if _, err := normalize(u); err != nil {
		httpjson.Error(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := r.AddWorker(req.Context(), u); err != nil {
		status := http.StatusServiceUnavailable
		if strings.Contains(err.Error(), "already there") {
			status = http.StatusConflict
		}
		httpjson.Error(w, status, err.Error())
		return
	}
	r.listWorkers(w, req)
}

func (r *Router) deleteWorker(w http.ResponseWriter, req *http.Request) {
	u := req.PathValue("url")
	if u == "" {
		u = req.URL.Query().Get("url")
	}
	if err := r.RemoveWorker(u); err != nil {
		status := http.StatusNotFound
		if strings.Contains(err.Error(), "want http") {
			status = http.StatusBadRequest
		}
		httpjson.Error(w, status, err.Error())
		return
	}
	r.listWorkers(w, req)
}
