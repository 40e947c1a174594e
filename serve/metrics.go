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

func newMetrics(s *Scheduler) *metrics {
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
		gauge("moex_cache_blocks_used", "Latent-cache blocks held (per layer).", func() float64 { return float64(s.kv.NumBlocks() - s.kv.FreeBlocks()) }),
		gauge("moex_cache_blocks_total", "Latent-cache blocks (per layer).", func() float64 { return float64(s.kv.NumBlocks()) }),
		gauge("moex_prefix_cache_blocks", "Latent-cache blocks the prefix cache holds (per layer).", func() float64 { return float64(s.Stats().CachedBlocks) }),
		gauge("moex_cache_hit_rate", "Prompt tokens found in the prefix cache over prompt tokens, of the requests admitted.", func() float64 { return s.Stats().HitRate() }),
	)
	return m
}

func (m *metrics) handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// observe passes a request's events on, timing them and counting its
// tokens and how it ended.
func (m *metrics) observe(promptTokens int, in <-chan Event) <-chan Event {
	start := time.Now()
	m.promptTokens.Add(float64(promptTokens))
	out := make(chan Event, cap(in))
	go func() {
		defer close(out)
		last := start
		first := true
		for e := range in {
			now := time.Now()
			if e.Done {
				status := "ok"
				if e.Err != nil {
					status = "error"
				}
				m.requests.WithLabelValues(status).Inc()
				m.cachedTokens.Add(float64(e.Cached))
				m.e2e.Observe(now.Sub(start).Seconds())
			} else {
				m.genTokens.Inc()
				if first {
					m.ttft.Observe(now.Sub(start).Seconds())
					first = false
				} else {
					m.itl.Observe(now.Sub(last).Seconds())
				}
				last = now
			}
			out <- e
		}
	}()
	return out
}
