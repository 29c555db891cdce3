package probe_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/probe"
)

// denyingProxy is a forward proxy on loopback that answers every request itself with
// status, as Squid does for a destination its ACLs refuse (403 ERR_ACCESS_DENIED) or a
// vendor's gateway does for an account it suspended. It never connects anywhere.
func denyingProxy(t *testing.T, status int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				resp := &http.Response{StatusCode: status, ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{
					"X-Squid-Error": {"ERR_ACCESS_DENIED 0"}, "Via": {"1.1 proxy (squid)"}}, Close: true}
				_ = resp.Write(c)
			}(c)
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// TestReview2AProxysOwnRefusalOfAnHTTPTargetIsTheProxys: the probe keeps a CONNECT refused
// with 403 on the proxy's side ("the proxy's own policy, not the target's state"), but the
// same refusal of a plain-http target (Squid answers the GET itself with 403) is marked
// TargetFailed. A fleet of proxies that deny the health-check destination (a Squid
// configuration rolled out with a wrong ACL, a vendor that suspended the account and
// answers 403 to everything) then reads as "health-check target down": every proxy keeps
// its healthy verdict, stays leasable and is never replaced.
func TestReview2AProxysOwnRefusalOfAnHTTPTargetIsTheProxys(t *testing.T) {
	proxy := denyingProxy(t, http.StatusForbidden)
	ctx := context.Background()

	https := probe.Probe(ctx, probe.Request{Proxy: proxy, URL: "https://127.0.0.1:1/healthz", Timeout: 5 * time.Second})
	require.False(t, https.OK)
	require.False(t, https.TargetFailed, "control: a CONNECT refused with 403 is the proxy's")

	plain := probe.Probe(ctx, probe.Request{Proxy: proxy, URL: "http://127.0.0.1:1/healthz", Timeout: 5 * time.Second})
	require.False(t, plain.OK)
	assert.False(t, plain.TargetFailed,
		"the proxy refused the destination itself (403 with X-Squid-Error), yet the failure is charged to the target: %+v", plain)
}
