package gateway

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReview35FleetSendsNoRequestAgainThatTheSiteBeganToAnswer: on a pooled connection,
// the site answers the next request with a 103 (passed to the crawler through the reverse
// proxy's hook), then the connection ends. The request reached the site and was being
// answered, so it is not the stale connection errStaleConn means (the proxy never read the
// request): the standard transport sends it again only when not one byte of an answer came
// (its Peek failed). fleetTransport resets lr.N after each 1xx it passes on, so its
// "nothing read" test (lr.N == maxAnswerHead) holds after a 1xx, and the GET goes to the
// site a second time (a site that sends its 1xx again has them reach the crawler twice).
func TestReview35FleetSendsNoRequestAgainThatTheSiteBeganToAnswer(t *testing.T) {
	p := newRawProxy(t, func(p *rawProxy, n int, c net.Conn, br *bufio.Reader) {
		if n > 0 {
			answerAll(p, n, c, br)
			return
		}
		// The first request is answered whole (the connection goes to the pool); the
		// second gets an Early Hints, then the connection ends.
		if _, err := p.readRequest(br); err != nil {
			return
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
		if _, err := p.readRequest(br); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
	})
	ft, _ := testFleetTransport(t, 5*time.Second)
	body, err := roundTripBody(t, ft, fleetRequest(t, context.Background(), p, http.MethodGet))
	require.NoError(t, err)
	require.Equal(t, "ok", body)
	require.Equal(t, 1, ft.idleCount(), "the first connection is pooled")

	var hints atomic.Int32
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(int, textproto.MIMEHeader) error { hints.Add(1); return nil },
	})
	_, _ = roundTripBody(t, ft, fleetRequest(t, ctx, p, http.MethodGet))
	assert.Len(t, p.requests(), 2, "the second GET reached the site once, which answered it 103; it was sent again")
	assert.EqualValues(t, 1, hints.Load(), "the crawler got the site's 1xx once")
}

// TestReview35FleetSendsNoEmptyProxyAuthorization: a fleet proxy that takes no
// credentials (discovery's LeasedProxy then has no userinfo in its URL) was sent no
// Proxy-Authorization by the standard transport. fleetTransport sends
// "Proxy-Authorization: " with an empty value; a proxy that passes headers it does not use
// on shows the site a header that says a proxy is in the way (what Rewrite strips Via,
// Forwarded and X-Forwarded-* for).
func TestReview35FleetSendsNoEmptyProxyAuthorization(t *testing.T) {
	var sent atomic.Int32 // requests that carried a Proxy-Authorization, empty or not
	p := newRawProxy(t, func(p *rawProxy, _ int, c net.Conn, br *bufio.Reader) {
		for {
			req, err := p.readRequest(br)
			if err != nil {
				return
			}
			if _, ok := req.Header["Proxy-Authorization"]; ok {
				sent.Add(1)
			}
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
		}
	})
	ft, _ := testFleetTransport(t, 5*time.Second)
	req, err := http.NewRequest(http.MethodGet, "http://site.test/page", nil)
	require.NoError(t, err)
	pu := &url.URL{Scheme: "http", Host: p.addr.String()} // a proxy without credentials
	req = req.WithContext(context.WithValue(context.Background(), fleetProxyKey{}, pu))
	body, err := roundTripBody(t, ft, req)
	require.NoError(t, err)
	require.Equal(t, "ok", body)
	require.Len(t, p.requests(), 1)
	assert.Zero(t, sent.Load(), "a proxy without credentials is sent no Proxy-Authorization (as http.Transport does)")
}

// review35AfterFuncsPending says whether a goroutine started by context.AfterFunc (here
// fleetTransport.exchange's, which sets the past deadline) has yet to end. The name it
// looks for comes from the method itself, so a rename cannot leave it looking for nothing.
func review35AfterFuncsPending() bool {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	return strings.Contains(string(buf[:n]), review35ExchangeName+".func")
}

// review35ExchangeName is fleetTransport.exchange's name as a stack trace gives it
// (without its package path).
var review35ExchangeName = func() string {
	name := runtime.FuncForPC(reflect.ValueOf((*fleetTransport).exchange).Pointer()).Name()
	return name[strings.LastIndexByte(name, '/')+1:]
}()

// TestReview35FleetCrawlerLeavingIsNotForgottenOnceTheHeadIsRead: the crawler leaves
// while its answer's head is being read (here, while its 1xx is passed on, with the final
// head already buffered). context.AfterFunc sets the connection's deadline in the past, but
// exchange then clears the read deadline (SetReadDeadline(time.Time{}) after the head),
// which undoes it: the body's next read waits on the site with nothing to cut it, holding
// the connection (and, in the gateway, the lease until the silence timer, a minute by
// default). The standard transport ends the body read when the request's context ends.
func TestReview35FleetCrawlerLeavingIsNotForgottenOnceTheHeadIsRead(t *testing.T) {
	release := make(chan struct{})
	p := newRawProxy(t, func(p *rawProxy, _ int, c net.Conn, br *bufio.Reader) {
		if _, err := p.readRequest(br); err != nil {
			return
		}
		// A 1xx and the final head with the start of its body in one write (they arrive
		// in one read), then the site stalls.
		_, _ = io.WriteString(c, "HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nstart")
		<-release
	})
	// After newRawProxy's cleanup in the order cleanups run (last first): the stalled site
	// ends before the proxy waits for its connections.
	t.Cleanup(func() { close(release) })
	ft, _ := testFleetTransport(t, 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		Got1xxResponse: func(int, textproto.MIMEHeader) error {
			// The crawler leaves now; what the crawler's leaving sets has been set before
			// the hook returns.
			cancel()
			require.Eventually(t, func() bool { return !review35AfterFuncsPending() }, 10*time.Second, time.Millisecond)
			return nil
		},
	})
	resp, err := ft.RoundTrip(fleetRequest(t, ctx, p, http.MethodGet))
	if err != nil {
		return // the crawler's leaving ended the exchange: sound
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		done <- err
	}()
	select {
	case err := <-done:
		assert.Error(t, err, "the answer was cut short")
	case <-time.After(3 * time.Second):
		_ = resp.Body.Close()
		<-done
		t.Fatal("the crawler left, and the body read waited on the site with no deadline")
	}
}

// TestReview35FleetSendsNothingForACrawlerThatLeft: a request whose context has ended
// before the transport has it (the crawler left while its lease was granted, or between
// two attempts) is not sent: the standard transport looks at the context before it takes
// a connection. fleetTransport takes a pooled connection and writes the request at once;
// context.AfterFunc's deadline comes from another goroutine, usually after the write, so
// the site gets a request nobody waits for (a body-less DELETE or POST does its work, and
// the crawler, which saw its connection drop, may send it again).
func TestReview35FleetSendsNothingForACrawlerThatLeft(t *testing.T) {
	// One processor: the goroutine context.AfterFunc starts runs when the caller's blocks,
	// as it often does on a busy gateway.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var ended atomic.Int32
	var mu sync.Mutex
	perConn := map[int]int{} // requests read on each connection
	p := newRawProxy(t, func(p *rawProxy, n int, c net.Conn, br *bufio.Reader) {
		defer ended.Add(1)
		for {
			if _, err := p.readRequest(br); err != nil {
				return
			}
			mu.Lock()
			perConn[n]++
			mu.Unlock()
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
		}
	})
	ft, _ := testFleetTransport(t, 5*time.Second)
	for i := range 20 {
		body, err := roundTripBody(t, ft, fleetRequest(t, context.Background(), p, http.MethodDelete))
		require.NoError(t, err)
		require.Equal(t, "ok", body)
		require.Equal(t, 1, ft.idleCount(), "the connection is pooled")

		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the crawler has left
		resp, err := ft.RoundTrip(fleetRequest(t, ctx, p, http.MethodDelete))
		if err == nil {
			_ = resp.Body.Close()
		}
		// Whatever was sent, the connection ends: a transport that sent nothing may have
		// kept it, and the pool is emptied. Wait for the proxy to see the end, then count
		// what it read on it.
		ft.prune(true)
		require.Eventually(t, func() bool { return ended.Load() == int32(i+1) }, 10*time.Second, time.Millisecond)
		mu.Lock()
		got := perConn[i]
		mu.Unlock()
		require.Equal(t, 1, got, "iteration %d: a DELETE was sent for a crawler that had left", i)
	}
}
