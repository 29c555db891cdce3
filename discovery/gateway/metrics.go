package gateway

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// metrics are the gateway's, registered explicitly on the Registerer New is given; with a
// nil one they are created but not exported, so the gateway never checks for nil.
type metrics struct {
	requests         *prometheus.CounterVec
	upstreamFailures *prometheus.CounterVec
	retries          prometheus.Counter
	connectSeconds   prometheus.Histogram
	tunnels          prometheus.Gauge
	leasesHeld       prometheus.Gauge
	bytes            *prometheus.CounterVec
	reports          *prometheus.CounterVec
	leasesLost       prometheus.Counter
	waits            prometheus.Counter
	handoffs         *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_requests_total",
			Help: "Gateway requests (kind http) and tunnels (kind connect) by client and outcome: ok, auth_failed, invalid, throttled, no_proxy, upstream_failed, unavailable, canceled, aborted (the answer was cut off mid-way by the site or fleet proxy), internal.",
		}, []string{"client", "kind", "outcome"}),
		upstreamFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_upstream_failures_total",
			Help: "Fleet proxies that failed a gateway request or tunnel before it got through, by kind: unreachable, timeout, reset, auth, refused.",
		}, []string{"kind"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_retries_total",
			Help: "Gateway requests and tunnels tried again on another fleet proxy after one failed.",
		}),
		connectSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "proxyfleet_gateway_connect_duration_seconds",
			Help:    "Time to open a tunnel: lease, connection to the fleet proxy and its answer to CONNECT, retries included.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}),
		tunnels: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "proxyfleet_gateway_tunnels_open",
			Help: "CONNECT tunnels open through the gateway.",
		}),
		leasesHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "proxyfleet_gateway_leases_held",
			Help: "Leases the gateway holds for requests and tunnels in progress, renewed while they last; back to 0 when no traffic is in flight.",
		}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_tunnel_bytes_total",
			Help: "Bytes carried through gateway tunnels, by direction: upstream (crawler to site) and downstream.",
		}, []string{"direction"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_reports_total",
			Help: "Reports the gateway made from plain answers' statuses, by result.",
		}, []string{"result"}),
		waits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_waits_total",
			Help: "Gateway requests and tunnels that waited for a proxy to free a slot (every one that could take them was full or resting): the fleet is saturated.",
		}),
		handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_handoffs_total",
			Help: "Connections the gateway's event loops (Linux) passed to its HTTP server, by reason: request (not a CONNECT the loop serves: a plain request, or one it does not parse as the server would), refused (bad credentials, the rate limit, an index still loading, a bad target, no proxy within the wait), upstream (a fleet proxy failed; the server tries the next).",
		}, []string{"reason"}),
		leasesLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_leases_lost_total",
			Help: "Leases of open gateway requests or tunnels that could not be renewed (their proxy was replaced, turned unhealthy or left); the connection goes on uncounted.",
		}),
	}
	// The label values known in advance are exported at 0 from the start, so that a
	// dashboard shows them and an alert can compare against 0.
	for _, kind := range []string{failUnreachable, failTimeout, failReset, failAuth, failRefused, failSwitched} {
		m.upstreamFailures.WithLabelValues(kind)
	}
	for _, d := range []string{"upstream", "downstream"} {
		m.bytes.WithLabelValues(d)
	}
	for _, r := range []string{contract.ReportBanned, contract.ReportRateLimited} {
		m.reports.WithLabelValues(r)
	}
	for _, r := range []string{handoffRequest, handoffRefused, handoffUpstream} {
		m.handoffs.WithLabelValues(r)
	}
	if reg != nil {
		m.register(reg)
	}
	return m
}

// register registers m's metrics on reg. Gateways of one registry share their series, as
// they share the server whose leases they hold: a metric another gateway registered there
// first is counted into, not registered twice.
func (m *metrics) register(reg prometheus.Registerer) {
	m.requests = registered(reg, m.requests)
	m.upstreamFailures = registered(reg, m.upstreamFailures)
	m.retries = registered(reg, m.retries)
	m.connectSeconds = registered(reg, m.connectSeconds)
	m.tunnels = registered(reg, m.tunnels)
	m.leasesHeld = registered(reg, m.leasesHeld)
	m.bytes = registered(reg, m.bytes)
	m.reports = registered(reg, m.reports)
	m.leasesLost = registered(reg, m.leasesLost)
	m.waits = registered(reg, m.waits)
	m.handoffs = registered(reg, m.handoffs)
}

// registered registers c on reg, or returns the collector of the same metric registered
// there before.
func registered[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	panic(err)
}
