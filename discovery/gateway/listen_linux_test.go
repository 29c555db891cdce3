package gateway_test

import (
	"context"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
)

// TestListenGatewayKeepsConnectionsAlive: a connection the gateway's listener accepts has
// TCP keepalive on with Go's default timing, taken from the listening socket (Linux copies
// it into each connection), though the listener sets nothing per connection: without it a
// crawler that vanished without a word would hold its tunnel's slot for good.
func TestListenGatewayKeepsConnectionsAlive(t *testing.T) {
	ln, err := gateway.Listen(context.Background(), "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	accepted, err := ln.Accept()
	require.NoError(t, err)
	defer accepted.Close()
	raw, err := accepted.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	got := map[string]int{}
	require.NoError(t, raw.Control(func(fd uintptr) {
		for name, o := range map[string][2]int{
			"SO_KEEPALIVE":  {syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
			"TCP_KEEPIDLE":  {syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE},
			"TCP_KEEPINTVL": {syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
			"TCP_KEEPCNT":   {syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT},
		} {
			v, err := syscall.GetsockoptInt(int(fd), o[0], o[1])
			require.NoError(t, err)
			got[name] = v
		}
	}))
	require.Equal(t, map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 15, "TCP_KEEPINTVL": 15, "TCP_KEEPCNT": 9}, got)
}

// TestLastingTunnelsKeepTheirFleetProxyAlive: a tunnel's connection to its fleet proxy
// gets TCP keepalive once the tunnel has lasted a while (15 s; 50 ms here), so a fleet
// proxy gone without a word (a VM lost) frees the slot; a tunnel that has not lasted that
// long has none, which spares a tunnel per fetch four system calls.
func TestLastingTunnelsKeepTheirFleetProxyAlive(t *testing.T) {
	for _, tc := range []struct {
		after time.Duration
		want  bool
	}{{time.Hour, false}, {50 * time.Millisecond, true}} {
		e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, _ []discovery.Proxy) { g.KeepAliveAfter = tc.after })
		c := e.client(gwClient, gwToken)
		resp, body := get(t, c, e.site.tlsSite.URL+"/secure")
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		if tc.want {
			require.Eventually(t, func() bool {
				on := e.gw.UpstreamKeepAlive()
				return len(on) == 1 && on[0]
			}, 5*time.Second, 5*time.Millisecond, "a tunnel open for %s has no keepalive to its fleet proxy", tc.after)
		} else {
			require.Equal(t, []bool{false}, e.gw.UpstreamKeepAlive(), "a new tunnel already has keepalive to its fleet proxy")
		}
		c.Transport.(*http.Transport).CloseIdleConnections()
		e.waitNoLeases()
	}
}
