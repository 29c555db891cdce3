package gateway

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

// leaseOpsMock stands in for the lease domain in the gateway's unit tests: each operation
// is a field, and one left nil does what a fleet with nothing in it would.
type leaseOpsMock struct {
	grantFn    func(ctx context.Context, w discovery.Want, except func(string) bool) (*discovery.LeaseResponse, error)
	clientOfFn func(token string) (*discovery.Client, bool)

	mu       sync.Mutex
	released []string
}

func (m *leaseOpsMock) Grant(ctx context.Context, w discovery.Want, except func(string) bool) (*discovery.LeaseResponse, error) {
	if m.grantFn == nil {
		return nil, &discovery.NoMatch{}
	}
	return m.grantFn(ctx, w, except)
}

func (m *leaseOpsMock) RenewLease(context.Context, string, string, time.Duration) (*discovery.LeaseResponse, error) {
	return &discovery.LeaseResponse{}, nil
}

func (m *leaseOpsMock) ReleaseLease(_ context.Context, _, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.released = append(m.released, id)
	return nil
}

func (m *leaseOpsMock) ReportLease(context.Context, string, string, string, string) error { return nil }

func (m *leaseOpsMock) ClientOf(token string) (*discovery.Client, bool) {
	if m.clientOfFn == nil {
		return nil, true
	}
	return m.clientOfFn(token)
}

func (m *leaseOpsMock) Throttle(*discovery.Client) *discovery.APIError { return nil }
func (m *leaseOpsMock) Loaded() bool                                   { return true }
func (m *leaseOpsMock) Freed() uint64                                  { return 0 }
func (m *leaseOpsMock) Alone() bool                                    { return false }

// WaitForProxy answers the refusal: nothing frees up in a fleet of mocks.
func (m *leaseOpsMock) WaitForProxy(_ context.Context, _ discovery.Want, _ time.Duration, refusal error, _ uint64, _ discovery.Waiting) (*discovery.LeaseResponse, error) {
	return nil, refusal
}

func (m *leaseOpsMock) MayGrow(discovery.Selector) bool { return false }

func (m *leaseOpsMock) NoteRefusal(discovery.Want, error) {}

func (m *leaseOpsMock) releasedIDs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.released...)
}

var _ leaseOps = (*leaseOpsMock)(nil)

func mockGateway(ops leaseOps, cfg Config) *Gateway {
	return newGateway(cfg, ops, newMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
}

// gatewayAnswer sends the gateway a CONNECT to hostport and returns its answer and error body.
func gatewayAnswer(t *testing.T, g *Gateway, hostport string) (*http.Response, discovery.APIError) {
	t.Helper()
	r := httptest.NewRequest(http.MethodConnect, "http://"+hostport, nil)
	r.Host = hostport
	r.RequestURI = hostport
	w := httptest.NewRecorder()
	g.ServeHTTP(w, r)
	resp := w.Result()
	raw, _ := io.ReadAll(resp.Body)
	var ae discovery.APIError
	require.NoError(t, json.Unmarshal(raw, &ae), "a JSON error body: %s", raw)
	return resp, ae
}

// TestGatewayTellsARefusalWhenToRetry: no proxy free, and no waiting: a 503 no_match,
// its code in the header, the time the first slot frees up in Retry-After.
func TestGatewayTellsARefusalWhenToRetry(t *testing.T) {
	ops := &leaseOpsMock{grantFn: func(context.Context, discovery.Want, func(string) bool) (*discovery.LeaseResponse, error) {
		return nil, &discovery.NoMatch{Considered: 2, AtCapacity: 2, RetryAfter: 1500 * time.Millisecond}
	}}
	resp, ae := gatewayAnswer(t, mockGateway(ops, Config{Wait: -1}), "site.test:443")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, codes.NoMatch, resp.Header.Get(ErrorHeader))
	assert.Equal(t, "2", resp.Header.Get("Retry-After"))
	assert.Equal(t, codes.NoMatch, ae.Code)
	assert.Equal(t, 2, ae.Considered)
}

// TestGatewayAsksForProxyCredentials: a token no client holds gets a 407 with the
// challenge a proxy client answers, and no lease is asked for.
func TestGatewayAsksForProxyCredentials(t *testing.T) {
	ops := &leaseOpsMock{
		clientOfFn: func(string) (*discovery.Client, bool) { return nil, false },
		grantFn: func(context.Context, discovery.Want, func(string) bool) (*discovery.LeaseResponse, error) {
			t.Error("a lease was asked for a crawler that did not authenticate")
			return nil, &discovery.NoMatch{}
		},
	}
	resp, ae := gatewayAnswer(t, mockGateway(ops, Config{}), "site.test:443")
	assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode)
	assert.Equal(t, `Basic realm="proxyfleet"`, resp.Header.Get("Proxy-Authenticate"))
	assert.Equal(t, codes.ProxyAuthRequired, ae.Code)
}

// TestGatewayReleasesWhatAnUnreachableProxyWasLeased: each fleet proxy tried is leased
// and, when it cannot be reached, released at once; the crawler gets a 502 naming them.
func TestGatewayReleasesWhatAnUnreachableProxyWasLeased(t *testing.T) {
	// A loopback port nothing listens on any more.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := int32(ln.Addr().(*net.TCPAddr).Port)
	require.NoError(t, ln.Close())
	granted := 0
	ops := &leaseOpsMock{grantFn: func(_ context.Context, _ discovery.Want, except func(string) bool) (*discovery.LeaseResponse, error) {
		for _, name := range []string{"p0", "p1"} {
			if !except("fleet/" + name) {
				granted++
				l := &discovery.LeaseResponse{LeaseID: "lease-" + name}
				l.Proxy.Namespace, l.Proxy.Name, l.Proxy.IP, l.Proxy.Port = "fleet", name, "127.0.0.1", port
				return l, nil
			}
		}
		return nil, &discovery.NoMatch{Considered: 2}
	}}
	resp, ae := gatewayAnswer(t, mockGateway(ops, Config{Wait: -1}), "site.test:443")
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.Equal(t, codes.UpstreamFailed, ae.Code)
	assert.Contains(t, ae.Message, "2 tried")
	assert.Equal(t, 2, granted)
	assert.ElementsMatch(t, []string{"lease-p0", "lease-p1"}, ops.releasedIDs())
}
