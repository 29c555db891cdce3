package client

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// standInProxy is a loopback stand-in for a fleet proxy: it answers every plain-http
// request sent to it (in absolute form, as to a proxy) with its own name.
func standInProxy(t *testing.T, name string) (ip string, port int32) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, name) }))
	t.Cleanup(srv.Close)
	return hostPort(t, srv)
}

// hostPort is where srv listens, as a discovery.Proxy's IP and port.
func hostPort(t *testing.T, srv *httptest.Server) (string, int32) {
	t.Helper()
	host, p, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return host, int32(n)
}

// TestHeldFollowsReplacement: a held lease is renewed before it expires; when its proxy is
// replaced (a new address), the renewal's proxy_gone makes Held acquire a new lease, tell
// Changes, and send later requests through the new proxy, never the old one.
func TestHeldFollowsReplacement(t *testing.T) {
	ipA, portA := standInProxy(t, "A")
	ipB, portB := standInProxy(t, "B")
	p := proxy("p", true, 1, nil)
	p.IP, p.Port = ipA, portA
	f := newFixture(t, p)

	h, err := f.client.Hold(t.Context(), AcquireRequest{TTL: 2 * time.Second, Session: "s1"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	first, ok := h.Lease()
	require.True(t, ok)
	hc := h.HTTPClient()
	fetch := func() string {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://target.example/", nil)
		require.NoError(t, err)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}
	assert.Equal(t, "A", fetch())

	// Renewed, not replaced, while nothing changes: the lease outlives its 2s TTL.
	require.Eventually(t, func() bool {
		l, ok := h.Lease()
		return ok && l.ID == first.ID && l.ExpiresAt.After(first.ExpiresAt)
	}, 10*time.Second, 20*time.Millisecond, "the lease was not renewed")

	// The proxy is replaced by an instance elsewhere.
	p.IP, p.Port = ipB, portB
	f.store.Upsert(p)
	deadline := time.After(15 * time.Second)
	for {
		select {
		case l := <-h.Changes():
			if l == nil {
				continue // lost, acquiring
			}
			assert.NotEqual(t, first.ID, l.ID, "a new lease")
			assert.Equal(t, "s1", l.Session)
			assert.Equal(t, "B", fetch(), "requests go through the new proxy")
			require.NoError(t, h.Close(t.Context()))
			assert.Zero(t, f.store.Stats().Leases, "Close released the lease")
			return
		case <-deadline:
			t.Fatal("Held did not follow the replacement")
		}
	}
}

// TestHeldWithoutLeaseRefusesRequests: when the held lease's proxy leaves the fleet and
// no other can be leased, Held says so on Changes and its HTTP client fails fast instead
// of sending from an address nobody leased.
func TestHeldWithoutLeaseRefusesRequests(t *testing.T) {
	f := newFixture(t, proxy("p", true, 1, nil))
	h, err := f.client.Hold(t.Context(), AcquireRequest{TTL: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	f.store.ReplaceAll([]discovery.Proxy{}) // the proxy leaves the fleet
	select {
	case l := <-h.Changes():
		require.Nil(t, l, "no proxy is left to lease")
	case <-time.After(15 * time.Second):
		t.Fatal("Held did not notice its proxy was gone")
	}
	_, ok := h.Lease()
	assert.False(t, ok)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://target.example/", nil)
	require.NoError(t, err)
	_, err = h.HTTPClient().Do(req)
	assert.ErrorIs(t, err, ErrNoLease)
	assert.ErrorIs(t, h.Report(t.Context(), ResultBanned, ""), ErrNoLease)
	require.NoError(t, h.Close(t.Context()))
}
