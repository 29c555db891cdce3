package stack

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
	"github.com/proxyfleet/proxyfleet/discovery/service"
	"github.com/proxyfleet/proxyfleet/operator/controller"
)

// Discovery is a running discovery server of the stack.
type Discovery struct {
	URL string
	// GatewayAddr is the gateway's host:port: the fleet as one forward proxy.
	GatewayAddr string
	Token       string
	Store       *discovery.Store
	stop        func()
}

// Stop ends the server (tests that restart discovery call it before starting another).
func (d *Discovery) Stop() { d.stop() }

// StartDiscovery runs discovery in-process as cmd/discovery does (service.Service), reading
// the index from the stack's Temporal server with test-sized intervals, and returns once
// its index is loaded.
// Options, if given, adjust the configuration first (e.g. a longer full pass).
func (s *Stack) StartDiscovery(t testing.TB, options ...func(*service.Config)) *Discovery {
	t.Helper()
	const token = "test-token"
	cfg := service.Config{
		API:             discovery.Config{Token: token},
		Namespace:       s.Temporal.Namespace,
		RefreshInterval: 200 * time.Millisecond, FullResyncInterval: time.Minute, SweepInterval: 200 * time.Millisecond,
		// The key the stack's worker derives and seals with, so crawlers get working
		// credentials in lease answers.
		Keyring: s.Keyring,
	}
	for _, o := range options {
		o(&cfg)
	}
	svc := service.New(cfg, s.Temporal.Client, s.logger(), nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gw, err := gateway.Listen(context.Background(), "127.0.0.1:0") // as cmd/discovery listens
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = svc.ServeWithGateway(ctx, ln, gw) }()
	stopped := false
	d := &Discovery{URL: "http://" + ln.Addr().String(), GatewayAddr: gw.Addr().String(), Token: token, Store: svc.Store}
	d.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
	}
	t.Cleanup(d.stop)
	require.Eventually(t, svc.Store.Loaded, 30*time.Second, 20*time.Millisecond, "discovery did not load its index from Temporal")
	return d
}

// StartAutoscaler runs the operator's pool autoscaler for the pools of namespace ns,
// reading their demand from d as `operator --discovery-url` does, every interval, until
// the test ends.
func (s *Stack) StartAutoscaler(t testing.TB, d *Discovery, ns string, interval time.Duration) {
	t.Helper()
	a := &controller.Autoscaler{Client: s.Kube.Client, Demand: dclient.New(d.URL, d.Token), Interval: interval, Namespace: ns}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}
