package service_test

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/service"
)

type review31Temporal struct{}

func (review31Temporal) ListWorkflow(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	return &workflowservice.ListWorkflowExecutionsResponse{}, nil
}

func (review31Temporal) SignalWorkflow(context.Context, string, string, string, any) error {
	return nil
}

// review31Families are the metric families a scrape shows as soon as a826caa's
// NewService had registered its metrics (one MustRegister in newServerMetrics, the
// gateway's and the replica set's included, whatever the configuration), with their
// series then: the split registers them from four packages, and must show the same.
var review31Families = []string{
	"proxyfleet_discovery_acquire_duration_seconds HISTOGRAM 1",
	"proxyfleet_discovery_clients_reload_errors_total COUNTER 1",
	"proxyfleet_discovery_cooldowns_active GAUGE 1",
	"proxyfleet_discovery_credentials_unresolved GAUGE 4",
	"proxyfleet_discovery_forwarded_requests_total COUNTER 1",
	"proxyfleet_discovery_index_age_seconds GAUGE 1",
	"proxyfleet_discovery_index_healthy_proxies GAUGE 1",
	"proxyfleet_discovery_index_proxies GAUGE 1",
	"proxyfleet_discovery_leases_active GAUGE 1",
	"proxyfleet_discovery_replication_failures_total COUNTER 1",
	"proxyfleet_discovery_report_signal_failures_total COUNTER 1",
	"proxyfleet_discovery_reports_coalesced_total COUNTER 1",
	"proxyfleet_gateway_connect_duration_seconds HISTOGRAM 1",
	"proxyfleet_gateway_leases_held GAUGE 1",
	"proxyfleet_gateway_leases_lost_total COUNTER 1",
	"proxyfleet_gateway_reports_total COUNTER 2",
	"proxyfleet_gateway_retries_total COUNTER 1",
	"proxyfleet_gateway_tunnel_bytes_total COUNTER 2",
	"proxyfleet_gateway_tunnels_open GAUGE 1",
	"proxyfleet_gateway_upstream_failures_total COUNTER 6",
	"proxyfleet_gateway_waits_total COUNTER 1",
}

// TestReview31MetricFamiliesAsBefore: alone, with a token, and in a replica set, the
// process registers every metric once (no panic) and shows every family it showed before
// the split, with the same type and series (families added since are not held against
// it), the client leases gauge only when there are clients.
func TestReview31MetricFamiliesAsBefore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		api      discovery.Config
		replicas discovery.ReplicaConfig
		clients  bool
	}{
		{"alone", discovery.Config{}, discovery.ReplicaConfig{}, false},
		{"token", discovery.Config{Token: "t"}, discovery.ReplicaConfig{}, true},
		{"replicas", discovery.Config{Token: "t"}, discovery.ReplicaConfig{
			Peers: []string{"http://a", "http://b", "http://c"}, Tokens: []string{"x"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			require.NotPanics(t, func() {
				service.New(service.Config{API: tc.api, Replicas: tc.replicas}, review31Temporal{}, slog.New(slog.DiscardHandler), reg)
			})
			mfs, err := reg.Gather()
			require.NoError(t, err)
			var got []string
			for _, mf := range mfs {
				got = append(got, fmt.Sprintf("%s %s %d", mf.GetName(), mf.GetType(), len(mf.Metric)))
			}
			sort.Strings(got)
			for _, want := range review31Families {
				assert.Contains(t, got, want)
			}
			const clientLeases = "proxyfleet_discovery_client_leases GAUGE 1"
			if tc.clients {
				assert.Contains(t, got, clientLeases)
			} else {
				assert.NotContains(t, got, clientLeases)
			}
		})
	}
}
