package activities

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyfleet/proxyfleet/activities/monitor"
)

// Metrics are the worker's own series: the monitor's (probes, watches, reports, targets
// judged down; see monitor.Metrics) and the sweeper's. Per-proxy series are deliberately
// absent, so the series count stays bounded however large the fleet.
type Metrics struct {
	mon       *monitor.Metrics
	gcDeleted *prometheus.CounterVec
	gcSpared  *prometheus.CounterVec
	gcRuns    *prometheus.CounterVec
}

// NewMetrics creates and registers the metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		mon: monitor.NewMetrics(reg),
		gcDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gc_deleted_total",
			Help: "Orphaned instances deleted by the sweeper, by provider.",
		}, []string{"provider"}),
		gcSpared: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gc_spared_total",
			Help: "Instances the sweeper looked at and kept, by reason.",
		}, []string{"reason"}),
		gcRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gc_runs_total",
			Help: "Sweeps by outcome (swept, skipped).",
		}, []string{"outcome"}),
	}
	reg.MustRegister(m.gcDeleted, m.gcSpared, m.gcRuns)
	return m
}

// monitorMetrics is the monitor's share of m (nil when m is: tests).
func (m *Metrics) monitorMetrics() *monitor.Metrics {
	if m == nil {
		return nil
	}
	return m.mon
}
