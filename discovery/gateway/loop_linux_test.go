package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
)

// The event loops (loop_linux.go) serve CONNECT tunnels from head to end; these tests
// check that they do, that what they hand to the HTTP server is answered as before, and
// that every way a tunnel can end on a loop ends its lease.

// echoServer answers every connection with what it reads, until the other side ends.
func echoServer(t *testing.T) string {
	return serveConns(t, func(c net.Conn) { _, _ = io.Copy(c, c) }).String()
}

// stallingProxy accepts connections and reads them, and never answers.
func stallingProxy(t *testing.T) int {
	return serveConns(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) }).Port
}

// serveGatewayOn runs a gateway over srv alone until the test ends, and returns its address.
func serveGatewayOn(t *testing.T, srv *discovery.Server, before ...func(*gateway.Gateway)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := gateway.New(gateway.Config{}, srv, slog.New(slog.DiscardHandler), nil)
	for _, f := range before {
		f(g)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); _ = g.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served })
	return ln.Addr().String()
}

func (e *gatewayEnv) handoffs(reason string) float64 {
	return e.metric("proxyfleet_gateway_handoffs_total", "reason", reason)
}

func TestLoopServesTunnelsWithoutTheServer(t *testing.T) {
	e := newGatewayEnv(t, 2)
	conn, resp := e.connect(gwClient, gwToken, echoServer(t))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 1, e.gw.LoopTunnels(), "the open tunnel is the loop's")
	conn.Close()
	require.Eventually(t, func() bool { return e.gw.LoopTunnels() == 0 }, 5*time.Second, 5*time.Millisecond)
	c := e.client(gwClient, gwToken)
	c.Transport.(*http.Transport).DisableKeepAlives = true // a tunnel per fetch
	for range 20 {
		resp, _ := get(t, c, e.site.tlsSite.URL+"/page")
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	for _, reason := range []string{"request", "refused", "upstream"} {
		assert.Zero(t, e.handoffs(reason), "a tunnel handed to the server (%s)", reason)
	}
	assert.Equal(t, 21.0, e.metric("proxyfleet_gateway_requests_total", "client", gwClient, "kind", "connect", "outcome", "ok"))
	e.waitNoLeases()
	require.Eventually(t, func() bool { return e.metric("proxyfleet_gateway_tunnels_open") == 0 }, 5*time.Second, 5*time.Millisecond)
}

func TestLoopHandsTheServerWhatItDoesNotServe(t *testing.T) {
	e := newGatewayEnv(t, 1)
	// A plain request: the server forwards it.
	resp, _ := get(t, e.client(gwClient, gwToken), e.site.URL+"/page")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 1.0, e.handoffs("request"))
	// Wrong credentials: the server answers 407 with its JSON error.
	_, resp = e.connect(gwClient, "wrong", e.site.Listener.Addr().String())
	assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode)
	assert.Equal(t, "proxy_auth_required", resp.Header.Get(gateway.ErrorHeader))
	assert.Equal(t, 1.0, e.handoffs("refused"))
	// A fleet proxy that refuses the destination: the server answers why, once.
	e.proxies[0].deny(e.site.Listener.Addr().String())
	_, resp = e.connect(gwClient, gwToken, e.site.Listener.Addr().String())
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.Equal(t, 1.0, e.handoffs("upstream"))
	assert.Equal(t, 1.0, e.metric("proxyfleet_gateway_upstream_failures_total", "kind", "refused"), "the failure is counted once")
	e.waitNoLeases()
}

// TestLoopRelaysLargeTransfersBothWaysUnderBackpressure: 64 MiB each way at once through
// an echo, with a crawler that stops reading for a while, arrive whole and in order.
func TestLoopRelaysLargeTransfersBothWaysUnderBackpressure(t *testing.T) {
	e := newGatewayEnv(t, 1)
	conn, resp := e.connect(gwClient, gwToken, echoServer(t))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	// More than the buffers on the way can hold, with a small receive buffer on the
	// crawler's side: with TCP autotuning up to 32 MiB a socket (tcp_rmem), the buffers
	// of a machine held all of 8 MiB, and the writer never blocked.
	require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(64<<10))
	payload := make([]byte, 64<<20)
	_, _ = rand.Read(payload)
	sent := make(chan error, 1)
	go func() {
		_, err := conn.Write(payload)
		sent <- err
	}()
	// Nothing is read until the writer is blocked: every buffer on the way is full.
	require.Eventually(t, func() bool {
		return len(sent) == 0 && e.metric("proxyfleet_gateway_tunnel_bytes_total", "direction", "upstream") > 1<<20
	},
		10*time.Second, 5*time.Millisecond)
	got := make([]byte, len(payload))
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err := io.ReadFull(conn, got)
	require.NoError(t, err)
	require.NoError(t, <-sent)
	assert.Equal(t, sha256.Sum256(payload), sha256.Sum256(got), "the echo came back whole and in order")
	conn.Close()
	e.waitNoLeases()
}

func TestLoopCrawlerLeavingWhileTheProxyAnswersEndsTheLease(t *testing.T) {
	stall := stallingProxy(t)
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, _ *gateway.Config, fleet []discovery.Proxy) { fleet[0].Port = int32(stall) })
	c := e.rawCrawler(gwClient)
	c.send(http.MethodConnect, e.site.Listener.Addr().String(), e.site.Listener.Addr().String(), true)
	require.Eventually(t, func() bool { return e.leases() == 1 }, 5*time.Second, 5*time.Millisecond)
	c.conn.Close()
	e.waitNoLeases()
	require.Eventually(t, func() bool {
		return e.metric("proxyfleet_gateway_requests_total", "client", gwClient, "kind", "connect", "outcome", "canceled") == 1
	}, 5*time.Second, 5*time.Millisecond)
}

func TestLoopBoundsTheProxysAnswer(t *testing.T) {
	stall := stallingProxy(t)
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, fleet []discovery.Proxy) {
		fleet[0].Port = int32(stall)
		g.ConnectTimeout = 200 * time.Millisecond
	})
	_, resp := e.connect(gwClient, gwToken, e.site.Listener.Addr().String())
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.Equal(t, 1.0, e.metric("proxyfleet_gateway_upstream_failures_total", "kind", "timeout"))
	e.waitNoLeases()
}

func TestLoopClosesACrawlerThatSendsNoHead(t *testing.T) {
	store := discovery.NewStore(time.Hour)
	srv := discovery.NewServer(discovery.Config{}, store, nil, &fakeSignaler{}, slog.New(slog.DiscardHandler), nil)
	addr := serveGatewayOn(t, srv, func(g *gateway.Gateway) { g.SetHeaderTimeout(200 * time.Millisecond) })
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "CONNECT example.test:443 HTTP/1.1\r\nHost: exa")
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "closed without an answer once the head's time is up")
}

// openEcho opens a tunnel through the gateway at addr (without credentials) to an echo
// server, sending after its head, and returns the connection and its reader.
func openEcho(t *testing.T, addr, after string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	echo := echoServer(t)
	_, err = io.WriteString(conn, "CONNECT "+echo+" HTTP/1.1\r\nHost: "+echo+"\r\n\r\n"+after)
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return conn, br
}

func TestLoopStopClosesItsTunnelsAndReleasesTheirLeases(t *testing.T) {
	_, fleet := startFleet(t, 1)
	store := discovery.NewStore(30 * time.Minute)
	store.ReplaceAll(fleet)
	srv := discovery.NewServer(discovery.Config{}, store, nil, &fakeSignaler{}, slog.New(slog.DiscardHandler), nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- gateway.New(gateway.Config{}, srv, nil, nil).Serve(ctx, ln) }()
	conn, br := openEcho(t, ln.Addr().String(), "")
	require.Equal(t, 1, store.Stats().Leases)
	cancel()
	require.NoError(t, <-served, "a gateway told to stop stops without an error")
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF)
	assert.Zero(t, store.Stats().Leases)
}

func TestLoopTunnelsThroughAnIPv6FleetProxy(t *testing.T) {
	proxies, fleet := startFleet(t, 1)
	ln6, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback")
	}
	t.Cleanup(func() { ln6.Close() })
	// The same fleet proxy, also on ::1.
	go func() { _ = (&http.Server{Handler: proxies[0], ReadHeaderTimeout: 5 * time.Second}).Serve(ln6) }()
	fleet[0].IP, fleet[0].Port = "::1", int32(ln6.Addr().(*net.TCPAddr).Port)
	store := discovery.NewStore(30 * time.Minute)
	store.ReplaceAll(fleet)
	srv := discovery.NewServer(discovery.Config{}, store, nil, &fakeSignaler{}, slog.New(slog.DiscardHandler), nil)
	_, br := openEcho(t, serveGatewayOn(t, srv), "hello")
	got := make([]byte, 5)
	_, err = io.ReadFull(br, got)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got), "the bytes sent with the head went through")
}

// TestLoopForwardsWhatCameWithTheHead: bytes sent right after the head
// (a TLS hello, often) go through the tunnel once it is open, whatever their size.
func TestLoopForwardsWhatCameWithTheHead(t *testing.T) {
	e := newGatewayEnv(t, 1)
	echo := echoServer(t)
	c, err := net.Dial("tcp", e.addr)
	require.NoError(t, err)
	defer c.Close()
	early := bytes.Repeat([]byte("early-bytes-"), 20000) // 240 KB, past any one read
	head := "CONNECT " + echo + " HTTP/1.1\r\nHost: " + echo + "\r\nProxy-Authorization: Basic " +
		base64.StdEncoding.EncodeToString([]byte(gwClient+":"+gwToken)) + "\r\n\r\n"
	go func() { _, _ = c.Write(append([]byte(head), early...)) }()
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, strconv.Itoa(resp.StatusCode))
	got := make([]byte, len(early))
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err = io.ReadFull(br, got)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(early, got))
}

// TestLoopTurnsFromAFastTransferToTheOthers: a tunnel whose site streams as fast as the
// loop can carry it does not hold its loop: another tunnel on it is answered meanwhile.
func TestLoopTurnsFromAFastTransferToTheOthers(t *testing.T) {
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, _ []discovery.Proxy) { g.Loops = 1 })
	// A site that never stops sending.
	site := serveConns(t, func(c net.Conn) {
		zeros := make([]byte, 1<<20)
		for {
			if _, err := c.Write(zeros); err != nil {
				return
			}
		}
	})
	bulk, resp := e.connect(gwClient, gwToken, site.String())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	go func() { _, _ = io.Copy(io.Discard, bulk) }()
	require.Eventually(t, func() bool {
		return e.metric("proxyfleet_gateway_tunnel_bytes_total", "direction", "downstream") > 64<<20
	},
		20*time.Second, 5*time.Millisecond)
	conn, resp := e.connect(gwClient, gwToken, echoServer(t))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, err := io.WriteString(conn, "ping")
	require.NoError(t, err)
	got := make([]byte, 4)
	_, err = io.ReadFull(conn, got)
	require.NoError(t, err, "the second tunnel waited on the first")
	assert.Equal(t, "ping", string(got))
}

// TestLoopTunnelsThatWaitedStayOnTheLoop: a tunnel that waits for a slot opens on its loop
// once it has one; one whose wait runs out is answered 503 by the server; one whose
// crawler leaves while it waits ends its wait and takes no lease.
func TestLoopTunnelsThatWaitedStayOnTheLoop(t *testing.T) {
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, fleet []discovery.Proxy) {
		fleet[0].MaxLeases = 1
		g.Wait = 30 * time.Second
	})
	echo := echoServer(t)
	first, resp := e.connect(gwClient, gwToken, echo)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	second := e.connectAsync(gwClient, echo)
	require.Eventually(t, func() bool { return e.metric("proxyfleet_gateway_waits_total") == 1 }, 10*time.Second, 5*time.Millisecond)
	first.Close()
	assert.Equal(t, http.StatusOK, status(t, second, "the waiting tunnel"))
	assert.Zero(t, e.handoffs("refused"), "the tunnel that waited went to the server")
	assert.Zero(t, e.handoffs("request"))

	// The second tunnel holds the slot now: a third waits, its crawler leaves.
	leaver := e.rawCrawler(gwClient)
	leaver.send(http.MethodConnect, echo, echo, true)
	require.Eventually(t, func() bool { return e.metric("proxyfleet_gateway_waits_total") == 2 }, 10*time.Second, 5*time.Millisecond)
	leaver.conn.Close()
	require.Eventually(t, func() bool {
		return e.metric("proxyfleet_gateway_requests_total", "client", gwClient, "kind", "connect", "outcome", "canceled") == 1
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, e.leases(), "only the open tunnel holds a lease")
}

func TestLoopAnswersAWaitThatRanOut(t *testing.T) {
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, fleet []discovery.Proxy) {
		fleet[0].MaxLeases = 1
		g.Wait = 100 * time.Millisecond
	})
	echo := echoServer(t)
	_, resp := e.connect(gwClient, gwToken, echo)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, resp = e.connect(gwClient, gwToken, echo)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "no_match", resp.Header.Get(gateway.ErrorHeader))
	assert.Equal(t, 1.0, e.handoffs("refused"))
}
