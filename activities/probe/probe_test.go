package probe_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// servers returns loopback targets: an http one, an https one with a CA the probe is told
// to trust, and one answering 503.
func servers(t testing.TB) (httpURL, httpsURL, badURL string, trust *tls.Config, hits *atomic.Int64) {
	t.Helper()
	hits = &atomic.Int64{}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("Traceparent") != "" {
			http.Error(w, "trace header leaked to target", http.StatusTeapot)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	plain := httptest.NewServer(ok)
	t.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(ok)
	t.Cleanup(secure.Close)
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(bad.Close)
	pool := x509.NewCertPool()
	pool.AddCert(secure.Certificate())
	return plain.URL + "/healthz", secure.URL + "/healthz", bad.URL + "/", &tls.Config{RootCAs: pool}, hits
}

func newServer(h http.Handler) *httptest.Server { return httptest.NewServer(h) }

// creds are what the test proxies require; wrong are not.
var (
	creds = proxyauth.Credentials{Username: proxyauth.ManagedUsername, Password: "probe-test-password"}
	wrong = proxyauth.Credentials{Username: proxyauth.ManagedUsername, Password: "not-the-password"}
)

// forwardProxy runs the project's real forward proxy on loopback with a fault. It requires
// creds, as every Managed proxy does.
func forwardProxy(t *testing.T, fault local.Fault) string {
	t.Helper()
	fp := &localproxy.ForwardProxy{Auth: local.NewAuth(creds)}
	fp.SetFault(fault)
	srv := httptest.NewServer(fp)
	t.Cleanup(func() {
		fp.SetFault(local.FaultNone) // release hung requests before closing
		srv.Close()
	})
	return srv.Listener.Addr().String()
}

// refusedAddr is a loopback address nothing listens on.
func refusedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func TestProbe(t *testing.T) {
	httpURL, httpsURL, badURL, trust, hits := servers(t)
	good := forwardProxy(t, local.FaultNone)
	cases := []struct {
		name     string
		proxy    string
		url      string
		tls      *tls.Config
		timeout  time.Duration
		wantOK   bool
		wantKind probe.Kind
		// creds presented; the zero value means the right ones (see below).
		creds *proxyauth.Credentials
	}{
		{"http target through a working proxy", good, httpURL, nil, 2 * time.Second, true, probe.KindNone, nil},
		{"https target through a working proxy (CONNECT + TLS)", good, httpsURL, trust, 2 * time.Second, true, probe.KindNone, nil},
		{"https target with an untrusted certificate", good, httpsURL, nil, 2 * time.Second, false, probe.KindTLS, nil},
		{"proxy that refuses connections", refusedAddr(t), httpURL, nil, 2 * time.Second, false, probe.KindRefused, nil},
		{"proxy asking for authentication (http)", forwardProxy(t, local.FaultAuth), httpURL, nil, 2 * time.Second, false, probe.KindProxyAuth, nil},
		{"proxy asking for authentication (CONNECT)", forwardProxy(t, local.FaultAuth), httpsURL, trust, 2 * time.Second, false, probe.KindProxyAuth, nil},
		{"proxy answering 502 to CONNECT", forwardProxy(t, local.FaultBadGateway), httpsURL, trust, 2 * time.Second, false, probe.KindBadGateway, nil},
		{"proxy answering 502 to a GET", forwardProxy(t, local.FaultBadGateway), httpURL, nil, 2 * time.Second, false, probe.KindBadGateway, nil},
		{"proxy that hangs past the timeout", forwardProxy(t, local.FaultHang), httpURL, nil, 300 * time.Millisecond, false, probe.KindTimeout, nil},
		{"proxy that hangs on CONNECT", forwardProxy(t, local.FaultHang), httpsURL, trust, 300 * time.Millisecond, false, probe.KindTimeout, nil},
		{"target with the wrong status", good, badURL, nil, 2 * time.Second, false, probe.KindWrongStatus, nil},
		{"proxy cannot reach the target", good, "http://" + refusedAddr(t) + "/", nil, 2 * time.Second, false, probe.KindBadGateway, nil},
		{"no credentials (http)", good, httpURL, nil, 2 * time.Second, false, probe.KindProxyAuth, &proxyauth.Credentials{}},
		{"no credentials (CONNECT)", good, httpsURL, trust, 2 * time.Second, false, probe.KindProxyAuth, &proxyauth.Credentials{}},
		{"wrong credentials (http)", good, httpURL, nil, 2 * time.Second, false, probe.KindProxyAuth, &wrong},
		{"wrong credentials (CONNECT)", good, httpsURL, trust, 2 * time.Second, false, probe.KindProxyAuth, &wrong},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			presented := creds
			if tc.creds != nil {
				presented = *tc.creds
			}
			res := probe.Probe(context.Background(), probe.Request{
				Proxy: tc.proxy, URL: tc.url, Timeout: tc.timeout, ExpectedStatus: 200, TLSConfig: tc.tls,
				Credentials: presented,
			})
			assert.Equal(t, tc.wantOK, res.OK, "result: %+v", res)
			if presented.Password != "" {
				assert.NotContains(t, res.Message, presented.Password, "a failure message must not carry the password")
			}
			assert.Equal(t, tc.wantKind, res.Kind, "result: %+v", res)
			if !tc.wantOK {
				assert.NotEmpty(t, res.Message)
			}
			assert.Positive(t, res.Latency)
			assert.Less(t, res.Latency, tc.timeout+time.Second, "the probe must respect its timeout")
		})
	}
	assert.Positive(t, hits.Load(), "targets were reached through the proxy")
}

// TestProbeDoesNotReuseConnections: a tunnel kept alive from an earlier probe would hide a
// proxy that stopped accepting connections.
func TestProbeDoesNotReuseConnections(t *testing.T) {
	httpURL, _, _, _, _ := servers(t)
	fp := &localproxy.ForwardProxy{Auth: local.NewAuth(creds)}
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(fp)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	for range 3 {
		res := probe.Probe(context.Background(), probe.Request{Proxy: srv.Listener.Addr().String(), URL: httpURL, Timeout: 2 * time.Second, Credentials: creds})
		require.True(t, res.OK, "%+v", res)
	}
	assert.Equal(t, int64(3), conns.Load(), "each probe opens its own connection")

	srv.Close()
	res := probe.Probe(context.Background(), probe.Request{Proxy: srv.Listener.Addr().String(), URL: httpURL, Timeout: 2 * time.Second, Credentials: creds})
	assert.False(t, res.OK)
	assert.Equal(t, probe.KindRefused, res.Kind)
}

func TestProbeRejectsBadURL(t *testing.T) {
	res := probe.Probe(context.Background(), probe.Request{Proxy: "127.0.0.1:1", URL: "ftp://x/"})
	assert.False(t, res.OK)
	assert.Equal(t, probe.KindOther, res.Kind)
}
