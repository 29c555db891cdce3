package gateway

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rawProxy is a fleet proxy stand-in on loopback that serves each connection with serve
// (given the connection's number, from 0), and counts them.
type rawProxy struct {
	addr  *net.TCPAddr
	conns atomic.Int32
	mu    sync.Mutex
	seen  []string // every request line read by readRequest
}

func newRawProxy(t *testing.T, serve func(p *rawProxy, n int, c net.Conn, br *bufio.Reader)) *rawProxy {
	p := &rawProxy{}
	p.addr = serveConns(t, func(c net.Conn) {
		n := int(p.conns.Add(1)) - 1
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		serve(p, n, c, bufio.NewReader(c))
	})
	return p
}

// readRequest reads one request head and notes it.
func (p *rawProxy) readRequest(br *bufio.Reader) (*http.Request, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.seen = append(p.seen, req.Method+" "+req.RequestURI+" "+req.Header.Get("Proxy-Authorization"))
	p.mu.Unlock()
	return req, nil
}

func (p *rawProxy) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

// answerAll answers every request on the connection with a short 200, kept open.
func answerAll(p *rawProxy, _ int, c net.Conn, br *bufio.Reader) {
	for {
		if _, err := p.readRequest(br); err != nil {
			return
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

type countingFallback struct{ n atomic.Int32 }

func (f *countingFallback) RoundTrip(*http.Request) (*http.Response, error) {
	f.n.Add(1)
	return nil, errors.New("fallback")
}

func testFleetTransport(t *testing.T, headerTimeout time.Duration) (*fleetTransport, *countingFallback) {
	fb := &countingFallback{}
	ft := newFleetTransport(&net.Dialer{Timeout: 5 * time.Second}, headerTimeout, fb)
	t.Cleanup(func() { ft.prune(true) })
	return ft, fb
}

// fleetRequest is a request for the site's URL through the fleet proxy p.
func fleetRequest(t *testing.T, ctx context.Context, p *rawProxy, method string) *http.Request {
	req, err := http.NewRequestWithContext(ctx, method, "http://site.test/page", nil)
	require.NoError(t, err)
	pu := &url.URL{Scheme: "http", Host: p.addr.String(), User: url.UserPassword("proxyfleet", "fleet-secret")}
	return req.WithContext(context.WithValue(ctx, fleetProxyKey{}, pu))
}

func roundTripBody(t *testing.T, ft *fleetTransport, req *http.Request) (string, error) {
	resp, err := ft.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestFleetTransportKeepsConnectionsAndTheProxysCredentialsToItself: requests one after
// another share one connection, each carries the fleet proxy's credentials in
// absolute form, and the request it was given ends as it came (no credentials left on it).
func TestFleetTransportKeepsConnectionsAndTheProxysCredentialsToItself(t *testing.T) {
	p := newRawProxy(t, answerAll)
	ft, fb := testFleetTransport(t, 5*time.Second)
	for range 5 {
		req := fleetRequest(t, context.Background(), p, http.MethodGet)
		body, err := roundTripBody(t, ft, req)
		require.NoError(t, err)
		assert.Equal(t, "ok", body)
		assert.Empty(t, req.Header.Get("Proxy-Authorization"), "the fleet proxy's credentials stay off the request")
	}
	assert.EqualValues(t, 1, p.conns.Load(), "one connection carried every request")
	seen := p.requests()
	require.Len(t, seen, 5)
	assert.Equal(t, "GET http://site.test/page "+basicAuth(url.UserPassword("proxyfleet", "fleet-secret")), seen[0])
	assert.Zero(t, fb.n.Load())

	// A request with a body, or one asking to switch protocols, is the standard
	// transport's.
	req, err := http.NewRequest(http.MethodPost, "http://site.test/form", strings.NewReader("a=1"))
	require.NoError(t, err)
	_, _ = ft.RoundTrip(req)
	up := fleetRequest(t, context.Background(), p, http.MethodGet)
	up.Header.Set("Connection", "Upgrade")
	up.Header.Set("Upgrade", "websocket")
	_, _ = ft.RoundTrip(up)
	assert.EqualValues(t, 2, fb.n.Load())
}

// TestFleetTransportSendsAgainWhenTheProxyClosedAPooledConnection: a proxy that closes a
// kept connection as the next request arrives (its idle timeout, racing the request) is
// not a failure: a request that is harmless to send twice goes again on a new
// connection; any other fails rather than be sent twice.
func TestFleetTransportSendsAgainWhenTheProxyClosedAPooledConnection(t *testing.T) {
	p := newRawProxy(t, func(p *rawProxy, _ int, c net.Conn, br *bufio.Reader) {
		// One answer, then the next request is read and the connection closed unanswered.
		if _, err := p.readRequest(br); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		_, _ = p.readRequest(br)
	})
	ft, _ := testFleetTransport(t, 5*time.Second)
	for i := range 3 {
		body, err := roundTripBody(t, ft, fleetRequest(t, context.Background(), p, http.MethodGet))
		require.NoError(t, err, "GET %d", i)
		assert.Equal(t, "ok", body)
	}
	// A body-less POST on a connection the proxy closes under it is not sent again.
	before := len(p.requests())
	_, err := roundTripBody(t, ft, fleetRequest(t, context.Background(), p, http.MethodPost))
	require.Error(t, err)
	assert.ErrorIs(t, err, errStaleConn)
	assert.Len(t, p.requests(), before+1, "the POST was sent once")
}

// TestFleetTransportBoundsWhatASiteCanMakeItWaitForAndRead: an answer head that never
// ends is cut at maxAnswerHead, a proxy that never answers at the header timeout, and a
// crawler that leaves ends the wait at once; none of those connections is kept.
func TestFleetTransportBoundsWhatASiteCanMakeItWaitForAndRead(t *testing.T) {
	endless := newRawProxy(t, func(p *rawProxy, _ int, c net.Conn, br *bufio.Reader) {
		if _, err := p.readRequest(br); err != nil {
			return
		}
		line := "X-Pad: " + strings.Repeat("y", 1000) + "\r\n"
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\n"); err != nil {
			return
		}
		for {
			if _, err := io.WriteString(c, line); err != nil {
				return
			}
		}
	})
	ft, _ := testFleetTransport(t, 20*time.Second)
	_, err := ft.RoundTrip(fleetRequest(t, context.Background(), endless, http.MethodGet))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "heads are over")

	silent := newRawProxy(t, func(p *rawProxy, _ int, _ net.Conn, br *bufio.Reader) {
		_, _ = p.readRequest(br)
		_, _ = br.ReadByte() // until the gateway hangs up
	})
	ft, _ = testFleetTransport(t, 100*time.Millisecond)
	_, err = ft.RoundTrip(fleetRequest(t, context.Background(), silent, http.MethodGet))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "timeout awaiting response headers")
	assert.Equal(t, failTimeout, ioFailure("p", err).kind, "counted as a timeout, not a reset")

	ft, _ = testFleetTransport(t, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := ft.RoundTrip(fleetRequest(t, ctx, silent, http.MethodGet))
		done <- err
	}()
	require.Eventually(t, func() bool { return len(silent.requests()) == 2 }, 10*time.Second, time.Millisecond)
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the crawler left and the wait went on")
	}
	assert.Zero(t, ft.idleCount(), "no connection that failed is kept")
}

// TestFleetTransportKeepsOnlyConnectionsItCanTrust: an answer closed before its end, one
// that says Connection: close, and one whose proxy sent bytes nobody asked for after it,
// leave no connection in the pool; idle ones are closed after idleTimeout.
func TestFleetTransportKeepsOnlyConnectionsItCanTrust(t *testing.T) {
	p := newRawProxy(t, func(p *rawProxy, n int, c net.Conn, br *bufio.Reader) {
		for {
			req, err := p.readRequest(br)
			if err != nil {
				return
			}
			var answer string
			switch req.URL.Query().Get("a") {
			case "long":
				answer = "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + strings.Repeat("z", 100000)
			case "close":
				answer = "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
			case "extra":
				answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray"
			default:
				answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
			}
			if _, err := io.WriteString(c, answer); err != nil {
				return
			}
		}
	})
	ft, _ := testFleetTransport(t, 5*time.Second)
	get := func(query string) string {
		req := fleetRequest(t, context.Background(), p, http.MethodGet)
		req.URL.RawQuery = query
		resp, err := ft.RoundTrip(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b := make([]byte, 2)
		_, err = io.ReadFull(resp.Body, b)
		require.NoError(t, err)
		if query != "a=long" {
			_, _ = io.Copy(io.Discard, resp.Body)
		}
		return string(b)
	}
	assert.Equal(t, "zz", get("a=long")) // closed after 2 of 100,000 bytes
	assert.Zero(t, ft.idleCount())
	assert.Equal(t, "ok", get("a=close"))
	assert.Zero(t, ft.idleCount())
	assert.Equal(t, "ok", get("a=extra"))
	// The stray answer is found before the connection carries another request.
	require.Eventually(t, func() bool {
		return get("") == "ok" && len(p.requests()) == 4
	}, 10*time.Second, time.Millisecond)
	assert.EqualValues(t, 4, p.conns.Load(), "every connection that could not be trusted was left")

	require.Equal(t, 1, ft.idleCount())
	ft.idleTimeout = time.Millisecond
	require.Eventually(t, func() bool { ft.prune(false); return ft.idleCount() == 0 }, 10*time.Second, time.Millisecond)
}

func (t *fleetTransport) idleCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nIdle
}
