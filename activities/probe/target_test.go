package probe_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
)

// silentTarget accepts connections on loopback and never answers, until the test ends.
func silentTarget(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// TestProbeSaysWhetherTheTargetFailed: a failure is the target's when the proxy did its part
// (it answered that it could not reach the target, or opened the tunnel) and the target's
// answer was wrong, late or missing; it is the proxy's when the proxy refused, asked for
// credentials or never answered. Monitor shards judge a target down from the former only,
// so a fleet of dead proxies is never taken for a dead target.
func TestProbeSaysWhetherTheTargetFailed(t *testing.T) {
	httpURL, httpsURL, badURL, trust, _ := servers(t)
	good := forwardProxy(t, local.FaultNone)
	silent := silentTarget(t)
	cases := []struct {
		name   string
		proxy  string
		url    string
		tls    bool
		kind   probe.Kind
		target bool
	}{
		{"target answers 503 (http)", good, badURL, false, probe.KindWrongStatus, true},
		{"target refuses connections (http: the proxy answers 502)", good, "http://" + refusedAddr(t) + "/", false, probe.KindBadGateway, true},
		{"target refuses connections (CONNECT answered 502)", good, "https://" + refusedAddr(t) + "/", true, probe.KindBadGateway, true},
		{"target's certificate is not trusted", good, httpsURL, false, probe.KindTLS, true},
		{"target never answers inside the open tunnel", good, "https://" + silent + "/", true, probe.KindTimeout, true},
		{"proxy refuses connections", refusedAddr(t), httpURL, false, probe.KindRefused, false},
		{"proxy asks for credentials", forwardProxy(t, local.FaultAuth), httpsURL, true, probe.KindProxyAuth, false},
		{"proxy never answers (http: a hung target looks the same, so it is the proxy's)", forwardProxy(t, local.FaultHang), httpURL, false, probe.KindTimeout, false},
		{"proxy never answers CONNECT", forwardProxy(t, local.FaultHang), httpsURL, true, probe.KindTimeout, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := probe.Request{Proxy: tc.proxy, URL: tc.url, Timeout: 300 * time.Millisecond, ExpectedStatus: 200, Credentials: creds}
			if tc.tls {
				req.TLSConfig = trust
			}
			res := probe.Probe(context.Background(), req)
			require.False(t, res.OK, "%+v", res)
			assert.Equal(t, tc.kind, res.Kind, "%+v", res)
			assert.Equal(t, tc.target, res.TargetFailed, "%+v", res)
		})
	}
	ok := probe.Probe(context.Background(), probe.Request{Proxy: good, URL: httpURL, Timeout: time.Second, Credentials: creds})
	require.True(t, ok.OK, "%+v", ok)
	assert.False(t, ok.TargetFailed)
}
