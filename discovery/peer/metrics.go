package peer

import "github.com/prometheus/client_golang/prometheus"

// metrics are the replica set's. They are registered explicitly on the Registerer the
// caller passes; with a nil one they are created but not exported.
type metrics struct {
	replicationFailures prometheus.Counter
	forwarded           prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		replicationFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_discovery_replication_failures_total",
			Help: "Lease changes a peer replica did not take (it was down or slow); the change waits for another peer's copy.",
		}),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_discovery_forwarded_requests_total",
			Help: "Renewals, releases and reports forwarded to the replica that owns the lease.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.replicationFailures, m.forwarded)
	}
	return m
}
