package serve

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the worker's Prometheus metrics, on a registry of its own.
type metrics struct {
	reg                     *prometheus.Registry
	requests                *prometheus.CounterVec // by status: ok, error, bad_request
	promptTokens, genTokens prometheus.Counter
	cachedTokens            prometheus.Counter
	ttft, itl, e2e          prometheus.Histogram
}

func newMetrics(s Engine) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "moex_requests_total",
		Help: "Requests to /generate, by how they ended: ok, error (the server's), bad_request."}, []string{"status"})
	m.promptTokens = prometheus.NewCounter(prometheus.CounterOpts{Name: "moex_prompt_tokens_total", Help: "Prompt tokens of the requests admitted."})
	m.cachedTokens = prometheus.NewCounter(prometheus.CounterOpts{Name: "moex_cached_prompt_tokens_total", Help: "Prompt tokens found in the prefix cache, of the requests ended."})
	m.genTokens = prometheus.NewCounter(prometheus.CounterOpts{Name: "moex_generation_tokens_total", Help: "Tokens generated."})
	buckets := prometheus.ExponentialBuckets(0.001, 2, 16)
	m.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "moex_time_to_first_token_seconds", Help: "From a request's arrival to its first token.", Buckets: buckets})
	m.itl = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "moex_inter_token_latency_seconds", Help: "Between a request's consecutive tokens.", Buckets: buckets})
	m.e2e = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "moex_e2e_request_latency_seconds", Help: "From a request's arrival to its end.", Buckets: buckets})
	gauge := func(name, help string, f func() float64) prometheus.GaugeFunc {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	m.reg.MustRegister(m.requests, m.promptTokens, m.cachedTokens, m.genTokens, m.ttft, m.itl, m.e2e,
		gauge("moex_num_running_reqs", "Requests in the running batch.", func() float64 { r, _ := s.Load(); return float64(r) }),
		gauge("moex_num_waiting_reqs", "Requests waiting for blocks or budget.", func() float64 { _, w := s.Load(); return float64(w) }),
		gauge("moex_cache_blocks_used", "Latent-cache blocks held (per layer, all ranks).", func() float64 { f, t := s.Blocks(); return float64(t - f) }),
		gauge("moex_cache_blocks_total", "Latent-cache blocks (per layer, all ranks).", func() float64 { _, t := s.Blocks(); return float64(t) }),
		gauge("moex_prefix_cache_blocks", "Latent-cache blocks the prefix cache holds (per layer).", func() float64 { return float64(s.Stats().CachedBlocks) }),
		gauge("moex_cache_hit_rate", "Prompt tokens found in the prefix cache over prompt tokens, of the requests admitted.", func() float64 { return s.Stats().HitRate() }),
	)
	return m
}

func (m *metrics) handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// observer times one request's events and counts its tokens and how it
// ended, on the goroutine that reads them.
type observer struct {
	m           *metrics
	start, last time.Time
	first       bool
}

// observe starts observing a request of promptTokens tokens.
func (m *metrics) observe(promptTokens int) *observer {
	m.promptTokens.Add(float64(promptTokens))
	now := time.Now()
	return &observer{m: m, start: now, last: now, first: true}
}

// event records e as it arrives.
func (o *observer) event(e Event) {
	now := time.Now()
	m := o.m
	if e.Done {
		status := "ok"
		if e.Err != nil {
			status = "error"
		}
		m.requests.WithLabelValues(status).Inc()
		m.cachedTokens.Add(float64(e.Cached))
		m.e2e.Observe(now.Sub(o.start).Seconds())
		return
	}
	m.genTokens.Inc()
	if o.first {
		m.ttft.Observe(now.Sub(o.start).Seconds())
		o.first = false
	} else {
		m.itl.Observe(now.Sub(o.last).Seconds())
	}
	o.last = now
}
