// Package gateway is discovery's forward proxy: the whole fleet behind one HTTP_PROXY
// address (plain HTTP and CONNECT), for crawlers that cannot speak the lease API. It
// leases through the same operations as the API's handlers (the leaseOps it is given), so
// its crawlers count against maxLeases, client caps, cooldowns and sessions as the API's
// do; what is its own is the proxying: dialling fleet proxies, tunnels, retries, waiting
// for a slot and renewing the leases of long requests.
package gateway

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

// CONNECT tunnels: a lease per tunnel, dialled through the fleet proxy, spliced both ways
// until either side ends or the tunnel is idle, its lease held (and renewed) meanwhile.

// tunnel opens a CONNECT tunnel through a fleet proxy, trying another when one fails
// before the tunnel is open, and splices it to the crawler.
func (g *Gateway) tunnel(w http.ResponseWriter, r *http.Request, x *exchange) string {
	start := time.Now()
	var (
		up    net.Conn
		early []byte
		l     *discovery.LeaseResponse
	)
	for up == nil && len(x.tried) < g.cfg.Attempts && !x.final {
		var err error
		l, err = g.leaseFor(r.Context(), x)
		switch {
		case r.Context().Err() != nil:
			// The crawler left (while it waited for a slot, or for a proxy): nobody reads
			// an answer, and no proxy failed.
			if err == nil {
				g.release(x.auth, l.LeaseID)
			}
			return "canceled"
		case err != nil:
			return g.failNoLease(w, x, err)
		}
		var f *upstreamFailure
		if up, early, f = g.dialTunnel(r.Context(), l, r.Host); f != nil {
			g.release(x.auth, l.LeaseID)
			if r.Context().Err() != nil {
				return "canceled"
			}
			g.failed(x, *f)
		}
	}
	if up == nil {
		return g.fail(w, x.upstreamError())
	}
	proxyID := l.Proxy.ID()
	cc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		g.release(x.auth, l.LeaseID)
		return g.fail(w, discovery.Errorf(codes.Invalid, "tunnels need HTTP/1.1 to the gateway"))
	}
	// The server's read and write deadlines must not cut a tunnel short.
	_ = cc.SetDeadline(time.Time{})
	t := &tunnel{client: cc, up: up, lease: l.LeaseID, auth: x.auth}
	if !g.track(t) {
		t.close()
		g.release(x.auth, l.LeaseID)
		return "unavailable"
	}
	head := "HTTP/1.1 200 Connection established\r\n" + ProxyHeader + ": " + proxyID + "\r\n\r\n"
	_, err = io.WriteString(cc, head)
	if err == nil && len(early) > 0 {
		_, err = cc.Write(early)
	}
	if err != nil {
		t.close() // the crawler is gone: the splices below end at once and clean up
	}
	// What the crawler sent after its CONNECT head (a TLS hello, often) is buffered.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			t.close()
		}
	}
	x.span.SetAttributes(attribute.String("proxyfleet.proxy", proxyID))
	g.metrics.connectSeconds.Observe(time.Since(start).Seconds())
	g.metrics.tunnels.Inc()
	t.left.Store(2)
	if tc, ok := up.(*net.TCPConn); ok {
		t.keep = time.AfterFunc(g.cfg.KeepAliveAfter, func() { _ = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true}) })
	}
	go g.splice(t, t.up, t.client, tunnelBytes{g.metrics.bytes.WithLabelValues("upstream"), &t.moved})
	go g.splice(t, t.client, t.up, tunnelBytes{g.metrics.bytes.WithLabelValues("downstream"), &t.moved})
	return "ok"
}

// dialTunnel connects to the leased proxy and asks it for a tunnel to hostport, all
// within ConnectTimeout. It returns the connection, any bytes the proxy sent after its
// 200, or what went wrong.
func (g *Gateway) dialTunnel(ctx context.Context, l *discovery.LeaseResponse, hostport string) (net.Conn, []byte, *upstreamFailure) {
	id := l.Proxy.ID()
	deadline := time.Now().Add(g.cfg.ConnectTimeout)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// No keepalive yet: a tunnel that lasts gets it (Config.KeepAliveAfter).
	c, err := (&net.Dialer{KeepAlive: -1}).DialContext(dctx, "tcp", net.JoinHostPort(l.Proxy.IP, strconv.Itoa(int(l.Proxy.Port))))
	if err != nil {
		return nil, nil, dialFailure(id, err, true)
	}
	_ = c.SetDeadline(deadline)
	if _, err := io.WriteString(c, connectRequest(l, hostport)); err != nil {
		c.Close()
		return nil, nil, ioFailure(id, err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, nil, ioFailure(id, err)
	}
	if f := connectRefused(id, resp); f != nil {
		c.Close()
		return nil, nil, f
	}
	_ = c.SetDeadline(time.Time{})
	var early []byte
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		early = slices.Clone(b)
	}
	return c, early, nil
}

// connectRequest is the CONNECT a tunnel asks the leased proxy for.
func connectRequest(l *discovery.LeaseResponse, hostport string) string {
	var b strings.Builder
	b.WriteString("CONNECT " + hostport + " HTTP/1.1\r\nHost: " + hostport + "\r\n")
	if l.Proxy.Username != "" {
		b.WriteString("Proxy-Authorization: Basic " +
			base64.StdEncoding.EncodeToString([]byte(l.Proxy.Username+":"+l.Proxy.Password)) + "\r\n")
	}
	b.WriteString("\r\n")
	return b.String()
}

// connectRefused is the failure a fleet proxy's answer to CONNECT says, or nil for a 2xx.
func connectRefused(id string, resp *http.Response) *upstreamFailure {
	if resp.StatusCode/100 == 2 {
		return nil
	}
	f := &upstreamFailure{proxy: id, kind: failRefused, detail: "answered " + resp.Status + " to CONNECT", retry: true}
	switch resp.StatusCode {
	case http.StatusProxyAuthRequired:
		f.kind, f.detail = failAuth, "refused its credentials (407)"
	case http.StatusBadRequest, http.StatusForbidden, http.StatusMethodNotAllowed:
		// The proxy refuses the request itself (a port or destination its rules do
		// not allow): another proxy of the fleet applies the same rules.
		f.retry = false
	}
	return f
}

// dialFailure classifies a failed connection to a fleet proxy. Its detail names no
// address or credentials, only what happened.
func dialFailure(id string, err error, retry bool) *upstreamFailure {
	f := &upstreamFailure{proxy: id, kind: failUnreachable, detail: "could not connect", retry: retry}
	switch {
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		f.kind, f.detail = failTimeout, "timed out connecting"
	case errors.Is(err, syscall.ECONNREFUSED):
		f.detail = "connection refused"
	}
	return f
}

// isTimeout says err is a timeout: a deadline that passed (os.ErrDeadlineExceeded is one)
// or any net.Error that says so.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ioFailure classifies a connection to a fleet proxy that broke or stalled before its
// answer.
func ioFailure(id string, err error) *upstreamFailure {
	f := &upstreamFailure{proxy: id, kind: failReset, detail: "closed the connection before answering", retry: true}
	if isTimeout(err) {
		f.kind, f.detail = failTimeout, "timed out before answering"
	}
	return f
}

// tunnel is an open tunnel: the crawler's connection and the fleet proxy's.
type tunnel struct {
	client, up  net.Conn
	lease, auth string
	// left counts the directions still copying; the last one to end cleans up.
	left atomic.Int32
	// moved counts the bytes carried either way, for closeWhenIdle, and idle is its timer.
	moved atomic.Int64
	idle  atomic.Pointer[time.Timer]
	// keep turns keepalive on for the fleet proxy's connection once the tunnel has lasted
	// Config.KeepAliveAfter (see Gateway.tunnel).
	keep *time.Timer
}

func (t *tunnel) close() {
	t.client.Close()
	t.up.Close()
}

// tunnelBytes counts a tunnel's bytes into the gateway's counter and the tunnel's own.
type tunnelBytes struct {
	prometheus.Counter
	moved *atomic.Int64
}

func (b tunnelBytes) Add(v float64) {
	b.Counter.Add(v)
	b.moved.Add(int64(v))
}

// splice copies one direction of a tunnel. A direction that ends cleanly half-closes the
// other side, so each peer sees the other's end of stream, and leaves the other direction
// HalfClosedTimeout of silence to finish (closeWhenIdle); one that fails closes both.
func (g *Gateway) splice(t *tunnel, dst, src net.Conn, bytes prometheus.Counter) {
	clean := copyCounting(dst, src, bytes) == nil
	if clean {
		closeWrite(dst)
	} else {
		t.close()
	}
	if t.left.Add(-1) == 0 {
		stopIdle(&t.idle)
		if t.keep != nil {
			t.keep.Stop()
		}
		t.close()
		g.untrack(t)
		g.metrics.tunnels.Dec()
		g.release(t.auth, t.lease)
		return
	}
	if clean {
		g.closeWhenIdle(&t.idle, &t.moved, func() bool { return t.left.Load() == 0 }, t.close)
	}
}

// closeWhenIdle ends a connection one side of which has ended: through closeFn, once moved
// (its bytes) has stood still for HalfClosedTimeout, unless over says it ended by itself.
// A crawler that hung up half-closes its tunnel as one that waits for the rest of an answer
// does, and a site that keeps a connection open while sending nothing would otherwise keep
// its slot taken for as long as it likes; the same goes for a crawler that never closes a
// tunnel the site has left. The pending timer is kept in timer, for stopIdle when the
// connection ends: at thousands of tunnels a second, timers left to run out would pile up.
func (g *Gateway) closeWhenIdle(timer *atomic.Pointer[time.Timer], moved *atomic.Int64, over func() bool, closeFn func()) {
	var arm func(last int64)
	arm = func(last int64) {
		timer.Store(time.AfterFunc(g.cfg.HalfClosedTimeout, func() {
			switch n := moved.Load(); {
			case over():
			case n != last:
				arm(n)
			default:
				closeFn()
			}
		}))
	}
	arm(moved.Load())
}

// stopIdle stops the timer of closeWhenIdle, if one was started.
func stopIdle(timer *atomic.Pointer[time.Timer]) {
	if t := timer.Load(); t != nil {
		t.Stop()
	}
}

// copyChunks copies src to dst until src ends, counting bytes as they pass. It copies
// in chunks of 1 MiB so that the counter moves during a long transfer; between two TCP
// connections each chunk is spliced by the kernel, never copied through user space. It is
// the portable copy; Linux's (copyCounting) also holds no pipe while a tunnel is idle.
func copyChunks(dst, src net.Conn, bytes prometheus.Counter) error {
	lr := &io.LimitedReader{R: src}
	for {
		lr.N = 1 << 20
		n, err := io.Copy(dst, lr)
		bytes.Add(float64(n))
		if err != nil || lr.N > 0 {
			return err
		}
	}
}

// closeWrite half-closes a connection: the peer reads its end, and may still answer.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	c.Close()
}

func (g *Gateway) track(t *tunnel) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.tunnels[t] = struct{}{}
	return true
}

func (g *Gateway) untrack(t *tunnel) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.tunnels, t)
}

// trackSwitched records a connection that switched protocols, to be closed when the
// gateway stops; once it has stopped (a switch answered after Serve returned), it says
// no: nothing would close the connection, nor renew its lease.
func (g *Gateway) trackSwitched(c *leaseConn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.switched[c] = struct{}{}
	return true
}

func (g *Gateway) untrackSwitched(c *leaseConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.switched, c)
}
