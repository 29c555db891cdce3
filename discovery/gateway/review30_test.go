package gateway_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
)

// TestReview30PipelinedCrawlerHangsUpOnAStalledAnswer: a crawler that sends anything
// after its request (the next pipelined request, or a stray CRLF) and then hangs up is
// never noticed: the server stops watching the connection once it has a byte of the next
// request, so the request's context is never cancelled. If the site then stalls
// mid-answer (headers and part of the body sent, then nothing), the gateway keeps the
// lease, and renews it, for as long as the site likes: nothing bounds a plain answer's
// silence (ResponseHeaderTimeout stops at the headers). Any client can so pin every slot
// of the fleet with one URL that stalls. Expected: the lease ends once the crawler is gone
// (or once the answer has been silent for a bound, as tunnels have HalfClosedTimeout): the
// gateway's bound is ResponseHeaderTimeout, for the body's silences as for the headers.
func TestReview30PipelinedCrawlerHangsUpOnAStalledAnswer(t *testing.T) {
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, _ []discovery.Proxy) {
		// Short, so the test ends soon, yet long enough that a loaded machine's scheduling
		// never makes the stream's start look like a stall.
		g.ResponseHeaderTimeout = time.Second
	})
	s := newAnswersSite(t)
	c := e.rawCrawler(gwClient)
	c.send(http.MethodGet, s.URL+"/stream", s.host(), true)
	resp := c.read(http.MethodGet)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	s.waitStarted(t, "/stream")
	_, err := io.ReadFull(resp.Body, make([]byte, len(streamStart)))
	require.NoError(t, err)
	// The start of the next request, pipelined, then the crawler is gone.
	_, err = io.WriteString(c.conn, "GET ")
	require.NoError(t, err)
	require.NoError(t, c.conn.Close())
	e.waitNoLeases()
}

// TestReview30SwitchAfterShutdownIsNeverClosed: a plain request that asked to switch
// protocols and is still waiting for the site's answer when the gateway stops outlives
// Serve (the server gives handlers 10 s, then leaves them running). When the 101 comes
// after that, the switched connection is tracked into a gateway that has already closed
// the ones it had (trackSwitched does not check closed, unlike track for tunnels): nothing
// will ever close it, its lease is no longer renewed and expires in the store while the
// connection carries on, and proxyfleet_gateway_leases_held stays above zero for good.
// Expected: as for a tunnel that opens after the gateway stopped, the switched connection
// is closed and its lease released.
func TestReview30SwitchAfterShutdownIsNeverClosed(t *testing.T) {
	relay := blindProxy(t)
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, _ *gateway.Config, fleet []discovery.Proxy) {
		fleet[0].Port = int32(relay)
	})
	started, answer := make(chan struct{}, 1), make(chan struct{})
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-answer
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		_ = buf.Flush()
		_, _ = io.Copy(conn, buf) // echoes for as long as the crawler talks
	}))
	t.Cleanup(site.Close)
	t.Cleanup(func() {
		select {
		case <-answer:
		default:
			close(answer)
		}
	})

	// A gateway of the same server whose stop the test controls.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := gateway.New(gateway.Config{Wait: -1}, e.srv, slog.New(slog.DiscardHandler), e.reg)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); _ = g.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served })

	c := &rawCrawler{t: t, auth: "Basic " + base64.StdEncoding.EncodeToString([]byte(gwClient+":"+gwToken))}
	c.conn, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { c.conn.Close() })
	c.br = bufio.NewReader(c.conn)
	host := strings.TrimPrefix(site.URL, "http://")
	c.send(http.MethodGet, site.URL+"/ws", host, true, "Connection: Upgrade", "Upgrade: echo")
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the site never got the request")
	}
	cancel()
	select {
	case <-served: // after the server's 10 s for handlers in flight
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway never stopped")
	}
	close(answer)
	// The site switches now. (What the crawler reads, a 101 or a refusal, is the fix's
	// choice; that its connection ends and its lease with it is not.)
	e.waitNoLeases()
	require.NoError(t, c.conn.SetDeadline(time.Now().Add(10*time.Second)))
	c.ended()
}

// TestReview30WaitersPollCostGrowsWithWaiters: every request waiting for a slot tries a
// grant by itself every waitPoll (500 ms), whether or not anything changed in the store,
// and each refused grant scans the matching proxies (and the leases of the full ones)
// under the store's one lock: about 80 µs at 1,000 proxies of 10 leases. A crawler run at
// concurrency 10,000 against that full fleet (hey -c 10000, a Scrapy CONCURRENT_REQUESTS
// set high) makes 20,000 such scans a second, over 1.6 s of lock time per second: the
// store is saturated and the served crawlers' grants and releases queue behind the
// waiters. Here, 300 waiters over 2 s of a fleet where nothing frees up. Expected: the
// cost of waiting does not grow with the number of waiters while nothing changes (a waiter
// looks again when the store has changed, or one look serves every waiter of a want).
func TestReview30WaitersPollCostGrowsWithWaiters(t *testing.T) {
	e := newOneSlotGatewayEnv(t, gateway.Config{Wait: time.Minute})
	gw := e.gw
	host := e.proxies[0].ln.Addr().String()
	_, resp := e.connect("", "", host)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	const waiters = 300
	for range waiters {
		e.connectAsync("", host)
	}
	require.Eventually(t, func() bool { return e.metric("proxyfleet_gateway_waits_total") == waiters }, 20*time.Second, 10*time.Millisecond)
	before := gw.WaitChecks()
	<-time.After(2 * time.Second) // a window of measure, nothing waits on it
	checks := gw.WaitChecks() - before
	t.Logf("%d waiters tried %d grants in 2 s with nothing freed", waiters, checks)
	require.LessOrEqual(t, checks, int64(20), "grants tried while nothing changed")
}
