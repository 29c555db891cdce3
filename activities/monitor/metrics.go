package monitor

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyfleet/proxyfleet/activities/probe"
)

// Metrics are the monitor's series on the worker. Per-proxy series are deliberately
// absent: probe outcomes are aggregated by kind, so the series count stays bounded however
// large the fleet (per-proxy state is in the operator's proxyfleet_proxy_info and in
// Temporal). A nil *Metrics records nothing (tests).
type Metrics struct {
	probeSeconds  *prometheus.HistogramVec
	probeFailures *prometheus.CounterVec
	monitors      prometheus.Gauge
	preemptions   *prometheus.CounterVec
	reports       *prometheus.CounterVec
	targetsDown   prometheus.Gauge
}

// NewMetrics creates and registers the monitor's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		probeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "proxyfleet_probe_duration_seconds",
			Help:    "Duration of probes through proxies, by outcome (ok, failed).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}, []string{"outcome"}),
		probeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_probe_failures_total",
			Help: "Failed probes by kind (refused, timeout, dns, proxy_auth, bad_gateway, proxy_error, tls, wrong_status, other).",
		}, []string{"kind"}),
		monitors: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "proxyfleet_monitors_running",
			Help: "Proxies this worker is watching: the members of the monitor shards it holds, and Monitor activities of older workflows.",
		}),
		preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_preemptions_total",
			Help: "Instances found preempted (taken back by the cloud, e.g. a GCP Spot VM), by provider; each is replaced at once.",
		}, []string{"provider"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_monitor_reports_total",
			Help: "Changes the monitor shards told proxies' workflows, by reason (verdict, latency, gone, stopped, credentials, target). Each is a signal and a workflow task: what an idle fleet costs Temporal beyond the shards' heartbeats.",
		}, []string{"reason"}),
		// A count, not a series per target: a target's URL is unbounded and may carry a
		// token; the Proxies' Healthy conditions name it.
		targetsDown: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "proxyfleet_health_check_targets_down",
			Help: "Health-check targets this worker's monitor shards judge down: most of the proxies probing one failed against it at once, so their verdicts are kept rather than turned unhealthy.",
		}),
	}
	for _, r := range reasons {
		m.reports.WithLabelValues(r)
	}
	for _, k := range probe.Kinds {
		m.probeFailures.WithLabelValues(string(k))
	}
	reg.MustRegister(m.probeSeconds, m.probeFailures, m.monitors, m.preemptions, m.reports, m.targetsDown)
	return m
}

func (m *Metrics) probed(res probe.Result) {
	if m == nil {
		return
	}
	outcome := "ok"
	if !res.OK {
		outcome = "failed"
		m.probeFailures.WithLabelValues(string(res.Kind)).Inc()
	}
	m.probeSeconds.WithLabelValues(outcome).Observe(res.Latency.Seconds())
}

func (m *Metrics) monitorStarted() func() {
	if m == nil {
		return func() {}
	}
	m.monitors.Inc()
	return m.monitors.Dec
}

func (m *Metrics) preempted(provider string) {
	if m == nil {
		return
	}
	m.preemptions.WithLabelValues(provider).Inc()
}

func (m *Metrics) reported(reason string) {
	if m == nil {
		return
	}
	m.reports.WithLabelValues(reason).Inc()
}

func (m *Metrics) targetDown(delta int) {
	if m == nil {
		return
	}
	m.targetsDown.Add(float64(delta))
}
