package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the HTTP API's. They are registered explicitly on the Registerer the caller
// passes; with a nil one they are created but not exported, so handlers never check for
// nil.
type metrics struct {
	leaseRequests  *prometheus.CounterVec
	acquireSeconds prometheus.Histogram
	requests       *prometheus.CounterVec
	requestSeconds *prometheus.HistogramVec
	clientRequests *prometheus.CounterVec
	// handler serves the Registerer's metrics when it is also a Gatherer.
	handler http.Handler
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		leaseRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_discovery_lease_requests_total",
			Help: "Lease requests by outcome: granted, no_match, invalid.",
		}, []string{"outcome"}),
		acquireSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "proxyfleet_discovery_acquire_duration_seconds",
			Help:    "Time to grant a lease, from request to response.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_discovery_http_requests_total",
			Help: "HTTP requests by method, route and status code.",
		}, []string{"method", "route", "code"}),
		requestSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "proxyfleet_discovery_http_request_duration_seconds",
			Help:    "HTTP request latency by route.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"route"}),
		// The client label takes the configured names only (at most discovery's maxClients).
		clientRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_discovery_client_requests_total",
			Help: "Authenticated API requests by client name and HTTP status code.",
		}, []string{"client", "code"}),
	}
	if reg == nil {
		return m
	}
	reg.MustRegister(m.leaseRequests, m.acquireSeconds, m.requests, m.requestSeconds, m.clientRequests)
	if g, ok := reg.(prometheus.Gatherer); ok {
		m.handler = promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	}
	return m
}

func (m *metrics) observeRequest(method, route string, code int, d time.Duration) {
	m.requests.WithLabelValues(method, route, strconv.Itoa(code)).Inc()
	m.requestSeconds.WithLabelValues(route).Observe(d.Seconds())
}
