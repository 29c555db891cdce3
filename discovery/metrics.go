package discovery

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// serverMetrics are the lease operations' (the HTTP API, discovery/httpapi, and the
// replica set, discovery/peer, have their own). They are registered explicitly on the Registerer the caller passes; with a nil
// one they are created but not exported, so handlers never check for nil.
type serverMetrics struct {
	reports              *prometheus.CounterVec
	reportsCoalesced     prometheus.Counter
	reportSignalFailures prometheus.Counter
	refreshSeconds       *prometheus.HistogramVec
	refreshErrors        *prometheus.CounterVec
	throttled            *prometheus.CounterVec
	clientsReloadErrors  prometheus.Counter
	// acquireWaits counts the acquires that waited for a proxy, by outcome; acquireWaiting
	// is how many wait now.
	acquireWaits   *prometheus.CounterVec
	acquireWaiting prometheus.Gauge
	// lastRefresh is the unix nanosecond time of the last successful refresh.
	lastRefresh atomic.Int64
}

func newServerMetrics(reg prometheus.Registerer, store *Store, clients *Clients) *serverMetrics {
	m := &serverMetrics{
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_discovery_reports_total",
			Help: "Crawler reports by result.",
		}, []string{"result"}),
		reportsCoalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_discovery_reports_coalesced_total",
			Help: "Reports not signalled because the proxy's workflow already has the cooldown they would start.",
		}),
		reportSignalFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_discovery_report_signal_failures_total",
			Help: "Reports whose signal to the proxy's workflow failed (the local cooldown still applied).",
		}),
		refreshSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "proxyfleet_discovery_index_refresh_duration_seconds",
			Help:    "Duration of index refreshes from Temporal, by kind (full, incremental).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"kind"}),
		refreshErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_discovery_index_refresh_errors_total",
			Help: "Failed index refreshes by kind.",
		}, []string{"kind"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_discovery_client_throttled_total",
			Help: "Requests refused with 429 by client and limit: requests (per second) or leases (held at once).",
		}, []string{"client", "limit"}),
		clientsReloadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_discovery_clients_reload_errors_total",
			Help: "Reloads of the clients file that failed (the clients loaded before stay in force).",
		}),
		acquireWaits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_discovery_acquire_waits_total",
			Help: "Acquires (POST /v1/leases with waitSeconds) that waited for a proxy, by outcome: granted, timeout (the 409), canceled (the crawler left), refused (another refusal ended the wait), stopped (discovery stopped: a 503 to retry).",
		}, []string{"outcome"}),
		acquireWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "proxyfleet_discovery_acquire_waiting",
			Help: "Acquires waiting for a proxy now.",
		}),
	}
	for _, o := range []string{waitGranted, waitTimedOut, waitCanceled, waitRefused, waitStopped} {
		m.acquireWaits.WithLabelValues(o) // exported at 0 before the first wait
	}
	if reg == nil {
		return m
	}
	gauge := func(name, help string, f func(Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return float64(f(store.Stats())) })
	}
	reg.MustRegister(m.reports, m.reportsCoalesced, m.reportSignalFailures,
		m.refreshSeconds, m.refreshErrors, m.throttled, m.clientsReloadErrors, m.acquireWaits, m.acquireWaiting,
		clientLeasesCollector{store: store, clients: clients,
			desc: prometheus.NewDesc("proxyfleet_discovery_client_leases", "Live leases by client name.", []string{"client"}, nil)},
		gauge("proxyfleet_discovery_leases_active", "Leases held right now (in a replica set, every replica counts all of them).", func(s Stats) int { return s.Leases }),
		gauge("proxyfleet_discovery_cooldowns_active", "Per-target cooldowns known locally.", func(s Stats) int { return s.Cooldowns }),
		gauge("proxyfleet_discovery_index_proxies", "Proxies in the index.", func(s Stats) int { return s.Proxies }),
		gauge("proxyfleet_discovery_index_healthy_proxies", "Healthy proxies in the index.", func(s Stats) int { return s.Healthy }),
		unresolvedCollector{store: store, desc: prometheus.NewDesc("proxyfleet_discovery_credentials_unresolved",
			"Proxies in the index that are not leased because their credentials cannot be resolved, by reason: "+
				strings.Join(credentialsReasons, ", ")+".", []string{"reason"}, nil)},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "proxyfleet_discovery_index_age_seconds",
			Help: "Seconds since the index last refreshed from Temporal: how stale what crawlers get may be.",
		}, func() float64 {
			last := m.lastRefresh.Load()
			if last == 0 {
				return -1
			}
			return time.Since(time.Unix(0, last)).Seconds()
		}),
	)
	return m
}

// clientLeasesCollector exports Store.clientLeases for the configured clients, zeros
// included.
type clientLeasesCollector struct {
	store   *Store
	clients *Clients
	desc    *prometheus.Desc
}

func (c clientLeasesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c clientLeasesCollector) Collect(ch chan<- prometheus.Metric) {
	if c.clients == nil {
		return
	}
	counts := c.store.clientLeases()
	for _, name := range c.clients.Names() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[name]), name)
	}
}

// unresolvedCollector exports Store.CredentialsUnresolved: one series per reason, zeros
// included, so an alert can compare against 0 from the start. One lock per scrape.
type unresolvedCollector struct {
	store *Store
	desc  *prometheus.Desc
}

func (c unresolvedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c unresolvedCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.store.CredentialsUnresolved()
	for _, reason := range credentialsReasons {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[reason]), reason)
	}
}

// ObserveRefresh records one index refresh; pass it as temporal.Refresher.Observe.
func (s *Server) ObserveRefresh(kind string, took time.Duration, _ int, err error) {
	s.metrics.refreshSeconds.WithLabelValues(kind).Observe(took.Seconds())
	if err != nil {
		s.metrics.refreshErrors.WithLabelValues(kind).Inc()
		return
	}
	s.metrics.lastRefresh.Store(time.Now().UnixNano())
}
