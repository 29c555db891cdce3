package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
	"github.com/proxyfleet/proxyfleet/discovery/service/servicetest"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// testToken is the API's token in the tests that run the gateway beside the API.
const testToken = "s3cret-token"

// fakeSignaler stands in for Temporal.
type fakeSignaler struct {
	report func(ctx context.Context, namespace, name string, sig contract.ReportSignal) error
}

var _ discovery.Signaler = (*fakeSignaler)(nil)

func (f *fakeSignaler) Report(ctx context.Context, namespace, name string, sig contract.ReportSignal) error {
	if f.report == nil {
		return nil
	}
	return f.report(ctx, namespace, name, sig)
}

// forwarded is one report the Signaler was given.
type forwarded struct {
	namespace, name string
	sig             contract.ReportSignal
}

// replicaSet is discovery's replicas in this process (servicetest), for the gateway's
// tests in a replica set.
type replicaSet = servicetest.ReplicaSet

func newReplicaSet(t *testing.T, n int, fleet []discovery.Proxy) *replicaSet {
	return servicetest.NewReplicaSet(t, n, fleet, servicetest.Options{Config: discovery.Config{Token: testToken,
		DefaultTTL: 5 * time.Minute, MaxTTL: time.Hour, CooldownRateLimited: 5 * time.Minute, CooldownBanned: 30 * time.Minute}})
}

// serveConns is the package's loopback server helper (serveConns in
// helpers_internal_test.go).
var serveConns = gateway.ServeConns
