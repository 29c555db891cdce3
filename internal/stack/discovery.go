package stack

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// Discovery is a running discovery server of the stack.
type Discovery struct {
	URL   string
	Token string
	Store *discovery.Store
	stop  func()
}

// Stop ends the server (tests that restart discovery call it before starting another).
func (d *Discovery) Stop() { d.stop() }

// StartDiscovery runs discovery in-process as cmd/discovery wires it, reading the index from
// the stack's Temporal server with test-sized intervals.
func (s *Stack) StartDiscovery(t testing.TB) *Discovery {
	t.Helper()
	const token = "test-token"
	store := discovery.NewStore(30 * time.Minute)
	srv := discovery.NewServer(discovery.Config{Token: token}, store,
		discovery.TemporalSignaler{Client: s.Temporal.Client}, quietLog(), nil)
	ref := &discovery.Refresher{Client: s.Temporal.Client, Namespace: s.Temporal.Namespace, Store: store,
		Interval: 200 * time.Millisecond, FullEvery: time.Minute, Log: quietLog()}
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, ref.Full(ctx), "first full index load")
	done := make(chan struct{}, 3)
	go func() { _ = ref.Run(ctx); done <- struct{}{} }()
	go func() { srv.RunReports(ctx); done <- struct{}{} }()
	go func() { store.RunSweeper(ctx, 200*time.Millisecond); done <- struct{}{} }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	stopped := false
	d := &Discovery{URL: "http://" + ln.Addr().String(), Token: token, Store: store}
	d.stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = hs.Close()
		cancel()
		for range 3 {
			<-done
		}
	}
	t.Cleanup(d.stop)
	return d
}
