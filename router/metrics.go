package router

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the router's Prometheus metrics, on a registry of its own.
type metrics struct {
	reg          *prometheus.Registry
	requests     *prometheus.CounterVec   // route, policy, status
	duration     *prometheus.HistogramVec // route: the whole request through the router
	upstream     *prometheus.HistogramVec // worker: to the response's headers
	ttfb         *prometheus.HistogramVec // worker: to the response's first bytes (a stream's first frame)
	retries      prometheus.Counter
	decisions    *prometheus.CounterVec // decision: hit, miss, imbalance, spill, or the policy's name
	healthEvents *prometheus.CounterVec // worker, up/down
}

func newMetrics(r *Router) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	buckets := prometheus.ExponentialBuckets(0.0001, 2, 20)
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "moex_router_requests_total",
		Help: "Requests through the router, by route, policy and the status the client got (499: it went away)."}, []string{"route", "policy", "status"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "moex_router_request_duration_seconds",
		Help: "Requests' time in the router, to their responses' ends.", Buckets: buckets}, []string{"route"})
	m.upstream = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "moex_router_upstream_latency_seconds",
		Help: "From sending to a worker to its response's headers.", Buckets: buckets}, []string{"worker"})
	m.ttfb = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "moex_router_time_to_first_byte_seconds",
		Help: "From sending to a worker to its response's first bytes (a stream's first token).", Buckets: buckets}, []string{"worker"})
	m.retries = prometheus.NewCounter(prometheus.CounterOpts{Name: "moex_router_retries_total", Help: "Attempts on another worker after a failed one."})
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "moex_router_decisions_total",
		Help: "The policy's decisions: cache_aware's hit, miss, imbalance and spill; other policies' names."}, []string{"decision"})
	m.healthEvents = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "moex_router_worker_health_changes_total",
		Help: "Workers taken out (down) or brought back (up) by the health checks."}, []string{"worker", "change"})
	m.reg.MustRegister(m.requests, m.duration, m.upstream, m.ttfb, m.retries, m.decisions, m.healthEvents,
		&workerCollector{r: r},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "moex_router_tree_bytes", Help: "Bytes of text the tree holds."},
			func() float64 { b, _ := r.tree.Size(); return float64(b) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "moex_router_tree_nodes", Help: "Nodes of the tree."},
			func() float64 { _, n := r.tree.Size(); return float64(n) }),
	)
	return m
}

func (m *metrics) handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// workerCollector reports each worker's load, health and circuit as they
// are now (workers come and go).
type workerCollector struct{ r *Router }

var (
	loadDesc    = prometheus.NewDesc("moex_router_worker_load", "Requests in flight to the worker through the router.", []string{"worker"}, nil)
	healthyDesc = prometheus.NewDesc("moex_router_worker_healthy", "1 while the worker takes requests.", []string{"worker"}, nil)
	circuitDesc = prometheus.NewDesc("moex_router_worker_circuit_open", "1 while the worker's circuit is open.", []string{"worker"}, nil)
)

func (c *workerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- loadDesc
	ch <- healthyDesc
	ch <- circuitDesc
}

func (c *workerCollector) Collect(ch chan<- prometheus.Metric) {
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for _, w := range c.r.Workers() {
		ch <- prometheus.MustNewConstMetric(loadDesc, prometheus.GaugeValue, float64(w.load.Load()), w.URL)
		ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, b(w.healthy.Load()), w.URL)
		ch <- prometheus.MustNewConstMetric(circuitDesc, prometheus.GaugeValue, b(w.breaker.State() == "open"), w.URL)
	}
}
