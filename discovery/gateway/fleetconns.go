package gateway

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// fleetTransport carries a plain request without a body to its fleet proxy on the calling
// goroutine, over connections it pools per proxy and credentials; requests with a body, and
// those asking to switch protocols, go to the standard transport (fallback).
//
// Why not the standard transport for everything: it serves each connection with two
// goroutines of its own and hands every request and answer between them and the caller
// over channels, four or five goroutine wake-ups a request, which on a gateway's few cores
// cost more than the forwarding itself. A request without a body is written whole before
// its answer is read, so one goroutine can do both; one with a body cannot (a site may
// answer before reading it all), and keeps the standard transport's concurrency.
type fleetTransport struct {
	dialer *net.Dialer
	// headerTimeout bounds the wait for an answer's head once the request is sent.
	headerTimeout time.Duration
	idleTimeout   time.Duration
	maxPerProxy   int
	maxIdle       int
	fallback      http.RoundTripper

	mu     sync.Mutex
	idle   map[string][]*fleetConn
	nIdle  int
	closed bool
}

// maxAnswerHead bounds one answer head from a fleet proxy (the standard transport's
// default): a site cannot make the gateway read an endless head into memory.
const maxAnswerHead = 10 << 20

type fleetConn struct {
	conn net.Conn
	lr   io.LimitedReader
	br   *bufio.Reader
	bw   *bufio.Writer
	key  string
	// auth is the Proxy-Authorization the connection's proxy takes.
	auth string
	// since is when it went idle; reused says it carried a request before this one.
	since  time.Time
	reused bool
}

func newFleetTransport(dialer *net.Dialer, headerTimeout time.Duration, fallback http.RoundTripper) *fleetTransport {
	return &fleetTransport{dialer: dialer, headerTimeout: headerTimeout, idleTimeout: time.Minute,
		maxPerProxy: 64, maxIdle: 4096, fallback: fallback, idle: map[string][]*fleetConn{}}
}

// carries says whether the request goes on the calling goroutine: it has no body and asks
// for no protocol switch.
func carries(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody {
		return false
	}
	_, up := req.Header["Upgrade"]
	return !up
}

// errStaleConn is a pooled connection the proxy had closed before the request reached it.
var errStaleConn = errors.New("the fleet proxy had closed the pooled connection")

func (t *fleetTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !carries(req) {
		return t.fallback.RoundTrip(req)
	}
	pu, err := fleetProxyOf(req)
	if err != nil {
		return nil, err
	}
	key := pu.String()
	for {
		if err := req.Context().Err(); err != nil {
			// The crawler left (before this attempt, or while a stale connection failed
			// under it): nothing is sent for it, as the standard transport sends nothing.
			return nil, err
		}
		c, err := t.get(req.Context(), key, pu)
		if err != nil {
			return nil, err
		}
		resp, err := t.exchange(c, req)
		if err == nil {
			return resp, nil
		}
		_ = c.conn.Close()
		if errors.Is(err, errStaleConn) && replayable(req) && req.Context().Err() == nil {
			// As the standard transport does: a request the proxy never read goes again,
			// on another connection, if sending it twice would be harmless anyway.
			continue
		}
		return nil, err
	}
}

// replayable says a request may be sent again after a connection failed under it: the
// standard transport's rule.
func replayable(req *http.Request) bool {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, k1 := req.Header["Idempotency-Key"]
	_, k2 := req.Header["X-Idempotency-Key"]
	return k1 || k2
}

// exchange sends req on c and reads its answer's head. The answer's body ends the
// exchange: read to its end, the connection goes back to the pool.
func (t *fleetTransport) exchange(c *fleetConn, req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	// The crawler leaving cuts whatever the connection waits for.
	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Unix(1, 0)) })
	// The request is the reverse proxy's own copy, which nothing reads after this: the
	// fleet proxy's credentials go on it for as long as it is written, and no longer.
	if c.auth != "" {
		req.Header["Proxy-Authorization"] = []string{c.auth}
	}
	err := req.WriteProxy(c.bw)
	delete(req.Header, "Proxy-Authorization")
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		stop()
		if c.reused && ctx.Err() == nil {
			return nil, fmt.Errorf("%w: %w", errStaleConn, err)
		}
		return nil, err
	}
	if t.headerTimeout > 0 {
		_ = c.conn.SetReadDeadline(time.Now().Add(t.headerTimeout))
		// This deadline replaces a past one the crawler's leaving may have set since the
		// write: then the wait ends now, not a header timeout later.
		if ctx.Err() != nil {
			stop()
			return nil, ctx.Err()
		}
	}
	var resp *http.Response
	c.lr.N = maxAnswerHead
	// informed says a 1xx came: the request reached the site, which began to answer it.
	informed := false
	for {
		resp, err = http.ReadResponse(c.br, req)
		if err != nil {
			stop()
			switch {
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case c.reused && !informed && c.lr.N == maxAnswerHead && c.br.Buffered() == 0 && staleError(err):
				return nil, fmt.Errorf("%w: %w", errStaleConn, err)
			case c.lr.N == 0:
				return nil, fmt.Errorf("the answer's heads are over %d bytes", maxAnswerHead)
			case isTimeout(err):
				// Still a timeout (errors.Is os.ErrDeadlineExceeded), which the failure's kind
				// says.
				return nil, fmt.Errorf("timeout awaiting response headers: %w", err)
			}
			return nil, err
		}
		code := resp.StatusCode
		if code < 100 || code > 199 || code == http.StatusSwitchingProtocols {
			break
		}
		informed = true
		// An informational answer (103 Early Hints, ...) goes to the crawler, and the next
		// head gets a limit of its own; one nobody passes on counts against the limit of
		// the heads read so far, which bounds how many a site can send (the standard
		// transport's rule).
		if trace := httptrace.ContextClientTrace(ctx); trace != nil && trace.Got1xxResponse != nil {
			if err := trace.Got1xxResponse(code, textproto.MIMEHeader(resp.Header)); err != nil {
				stop()
				return nil, err
			}
			c.lr.N = maxAnswerHead
		}
	}
	c.lr.N = math.MaxInt64
	if t.headerTimeout > 0 {
		_ = c.conn.SetReadDeadline(time.Time{})
		// Clearing the deadline may have undone the one the crawler's leaving set: if it
		// left, the exchange ends here (ctx.Err is set before AfterFunc's function runs,
		// and a leaving after this line sets its deadline after the clearing).
		if ctx.Err() != nil {
			stop()
			return nil, ctx.Err()
		}
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// Only a site switching unasked gets here (a request asking to switch goes to the
		// fallback), and that answer is refused: the connection is the site's now.
		stop()
		_ = c.conn.Close()
		return resp, nil
	}
	b := &fleetBody{t: t, c: c, body: resp.Body, stop: stop, keep: !resp.Close && !req.Close}
	if resp.Body == http.NoBody {
		b.finish(true)
		return resp, nil
	}
	resp.Body = b
	return resp, nil
}

// staleError says an error reading an answer's head is the connection's end (io.EOF comes
// back from http.ReadResponse as io.ErrUnexpectedEOF), which before any byte of the answer
// means the proxy closed it without reading the request.
func staleError(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// fleetBody is an answer's body on a pooled connection.
type fleetBody struct {
	t    *fleetTransport
	c    *fleetConn
	body io.ReadCloser
	stop func() bool
	keep bool
	done atomic.Bool
}

func (b *fleetBody) Read(p []byte) (int, error) {
	if b.done.Load() {
		return 0, errors.New("read on a closed answer")
	}
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.finish(true)
	}
	return n, err
}

// Close ends the answer: before its end, the connection goes (what is left of the answer
// is not worth reading to keep it). It may come from another goroutine than Read's (a
// silence timeout), and then cuts the Read short.
func (b *fleetBody) Close() error {
	b.finish(false)
	return nil
}

func (b *fleetBody) finish(eof bool) {
	if b.done.Swap(true) {
		return
	}
	if b.stop() && eof && b.keep {
		b.t.put(b.c)
		return
	}
	_ = b.c.conn.Close()
}

// get takes an idle connection to the proxy, or dials one.
func (t *fleetTransport) get(ctx context.Context, key string, pu *url.URL) (*fleetConn, error) {
	now := time.Now()
	for {
		t.mu.Lock()
		list := t.idle[key]
		if len(list) == 0 {
			t.mu.Unlock()
			break
		}
		c := list[len(list)-1]
		list[len(list)-1] = nil
		if len(list) == 1 {
			delete(t.idle, key)
		} else {
			t.idle[key] = list[:len(list)-1]
		}
		t.nIdle--
		t.mu.Unlock()
		if now.Sub(c.since) < t.idleTimeout && c.br.Buffered() == 0 && alive(c.conn) {
			c.reused = true
			return c, nil
		}
		_ = c.conn.Close()
	}
	addr := pu.Host
	if pu.Port() == "" {
		addr = net.JoinHostPort(pu.Hostname(), "80")
	}
	conn, err := t.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		// The shape the standard transport gives a proxy it could not reach, which is what
		// tells a failed connection (nothing was sent) from a failed request.
		return nil, &net.OpError{Op: "proxyconnect", Net: "tcp", Err: err}
	}
	c := &fleetConn{conn: conn, key: key, auth: basicAuth(pu.User)}
	c.lr.R = conn
	c.br = bufio.NewReader(&c.lr)
	c.bw = bufio.NewWriter(conn)
	return c, nil
}

func basicAuth(u *url.Userinfo) string {
	if u == nil {
		return ""
	}
	p, _ := u.Password()
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+p))
}

// put keeps an idle connection for the next request to its proxy.
func (t *fleetTransport) put(c *fleetConn) {
	c.since = time.Now()
	t.mu.Lock()
	if t.closed || t.nIdle >= t.maxIdle || len(t.idle[c.key]) >= t.maxPerProxy {
		t.mu.Unlock()
		_ = c.conn.Close()
		return
	}
	t.idle[c.key] = append(t.idle[c.key], c)
	t.nIdle++
	t.mu.Unlock()
}

// prune closes the connections idle for longer than idleTimeout (all of them if every is
// set, or once the transport is closed), so a proxy that left the fleet keeps none open.
func (t *fleetTransport) prune(every bool) {
	cut := time.Now().Add(-t.idleTimeout)
	var old []*fleetConn
	t.mu.Lock()
	for key, list := range t.idle {
		kept := list[:0]
		for _, c := range list {
			if every || c.since.Before(cut) {
				old = append(old, c)
			} else {
				kept = append(kept, c)
			}
		}
		clear(list[len(kept):])
		if len(kept) == 0 {
			delete(t.idle, key)
		} else {
			t.idle[key] = kept
		}
	}
	t.nIdle -= len(old)
	t.mu.Unlock()
	for _, c := range old {
		_ = c.conn.Close()
	}
}

// keepPruning prunes until ctx ends (the gateway stops), then closes every idle
// connection and keeps none after.
func (t *fleetTransport) keepPruning(ctx context.Context) {
	tick := time.NewTicker(t.idleTimeout / 2)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			// Answers still streaming find the pool closed when they end, and close their
			// connections themselves.
			t.mu.Lock()
			t.closed = true
			t.mu.Unlock()
			t.prune(true)
			if f, ok := t.fallback.(interface{ CloseIdleConnections() }); ok {
				f.CloseIdleConnections()
			}
			return
		case <-tick.C:
			t.prune(false)
		}
	}
}
