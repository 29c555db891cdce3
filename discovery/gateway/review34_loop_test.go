package gateway_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
)

// review34Proxy runs a fleet proxy on loopback that serves one CONNECT at a time as serve
// says, with the connection and what it read of it; it returns its port.
func review34Proxy(t *testing.T, serve func(conn net.Conn, br *bufio.Reader, req *http.Request)) int32 {
	t.Helper()
	return int32(serveConns(t, func(conn net.Conn) {
		br := bufio.NewReader(conn)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		serve(conn, br, req)
	}).Port)
}

// TestReview34LoopNeverAnswersABareLFConnectHead: a CONNECT whose head ends its lines with
// a bare LF (a hand-written crawler, printf | nc) is a request the HTTP server parses and
// serves (net/textproto takes LF as a line's end). The loop looks only for CRLFCRLF: it
// never sees the head end, and after the header timeout it closes the connection without
// a word. It hands over "anything the loop does not parse as the server would", except
// this. Expected: 200, as without loops (Config.Loops -1).
func TestReview34LoopNeverAnswersABareLFConnectHead(t *testing.T) {
	e := newGatewayEnv(t, 1)
	host := strings.TrimPrefix(e.site.URL, "http://")
	c := e.rawCrawler(gwClient)
	_, err := io.WriteString(c.conn, "CONNECT "+host+" HTTP/1.1\nHost: "+host+"\nProxy-Authorization: "+c.auth+"\n\n")
	require.NoError(t, err)
	require.NoError(t, c.conn.SetReadDeadline(time.Now().Add(3*time.Second)))
	resp, err := http.ReadResponse(c.br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err, "no answer to a CONNECT the HTTP server would have served")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestReview34LoopSwallowsTunnelBytesAfterABareLFHead: the same head, followed at once by
// the crawler's first bytes for the site (here a request with CRLFs). The loop takes the
// first CRLFCRLF, the end of the crawler's request to the site, for the end of the CONNECT
// head; http.ReadRequest stops at the bare LF blank line, and everything between (the
// whole request to the site) is dropped: the tunnel opens and the site never hears of it.
// The server, handed the same bytes, would send them on. Expected: the site's answer.
func TestReview34LoopSwallowsTunnelBytesAfterABareLFHead(t *testing.T) {
	e := newGatewayEnv(t, 1)
	host := strings.TrimPrefix(e.site.URL, "http://")
	c := e.rawCrawler(gwClient)
	_, err := io.WriteString(c.conn, "CONNECT "+host+" HTTP/1.1\nHost: "+host+"\nProxy-Authorization: "+c.auth+"\n\n"+
		"GET /inside HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, c.conn.SetReadDeadline(time.Now().Add(3*time.Second)))
	resp, err := http.ReadResponse(c.br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.ReadResponse(c.br, &http.Request{Method: http.MethodGet})
	require.NoError(t, err, "the request sent right after the CONNECT head never reached the site")
	b, _ := io.ReadAll(resp.Body)
	assert.Equal(t, "hello from /inside", string(b))
}

// TestReview34LoopTakesABareLFAnswerForATimeout: a fleet proxy whose answer to CONNECT
// ends its lines with a bare LF works through the goroutine path (http.ReadResponse takes
// it); the loop waits for CRLFCRLF that never comes, counts the proxy as timed out after
// ConnectTimeout and the server, which may not try it again, answers 502.
func TestReview34LoopTakesABareLFAnswerForATimeout(t *testing.T) {
	port := review34Proxy(t, func(conn net.Conn, br *bufio.Reader, req *http.Request) {
		site, err := net.Dial("tcp", req.Host)
		if err != nil {
			return
		}
		defer site.Close()
		if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\n\n"); err != nil {
			return
		}
		go func() { _, _ = io.Copy(site, br) }()
		_, _ = io.Copy(conn, site)
	})
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, fleet []discovery.Proxy) {
		fleet[0].Port = port
		g.ConnectTimeout = time.Second
	})
	_, resp := e.connect(gwClient, gwToken, strings.TrimPrefix(e.site.URL, "http://"))
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Errorf("the gateway answered %s: %s", resp.Status, body)
	}
	assert.Zero(t, e.metric("proxyfleet_gateway_upstream_failures_total", "kind", "timeout"))
}

// TestReview34LoopCancelsACrawlerThatSentAndHalfClosed: a crawler that sends its bytes for
// the site right after the CONNECT head and half-closes (nc -N, socat, a Go client's
// CloseWrite: a request-and-answer protocol through the tunnel) while the fleet proxy has
// yet to answer. The HTTP server sees a byte (its background read stops there) and never
// the end of stream: the tunnel opens, the bytes go through, the answer comes back. The
// loop ends the attempt on EPOLLRDHUP in stDialing/stAnswer ("canceled"), whatever is
// still unread before the FIN. Expected: 200 and the echo.
func TestReview34LoopCancelsACrawlerThatSentAndHalfClosed(t *testing.T) {
	asked := make(chan struct{}, 1)
	port := review34Proxy(t, func(conn net.Conn, br *bufio.Reader, req *http.Request) {
		asked <- struct{}{}
		// Answer once the gateway has had its chance to give up on the attempt: an end of
		// stream from the gateway says it did; silence, that it waits for the answer.
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := br.Peek(1); err != nil {
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				return // the gateway gave up
			}
		}
		_ = conn.SetReadDeadline(time.Time{})
		_, _ = io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n")
		line, _ := br.ReadString('\n')
		_, _ = io.WriteString(conn, "echo "+line)
	})
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, _ *gateway.Config, fleet []discovery.Proxy) {
		fleet[0].Port = port
	})
	c := e.rawCrawler(gwClient)
	c.send(http.MethodConnect, "whois.test:43", "whois.test:43", true)
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the fleet proxy was never asked")
	}
	_, err := io.WriteString(c.conn, "example.com\n")
	require.NoError(t, err)
	require.NoError(t, c.conn.(*net.TCPConn).CloseWrite())
	resp, err := http.ReadResponse(c.br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err, "the gateway dropped the crawler")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "echo example.com\n", c.readLine())
}
