package gateway

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// Connections the event loop (loop_linux.go) gives to the HTTP server: every one whose
// first request is not a CONNECT it can open by itself, with the bytes it already read,
// and, when it got as far as knowing the crawler, what it learned (a handoff).

// Reasons of a handoff, the label of proxyfleet_gateway_handoffs_total.
const (
	handoffRequest  = "request"  // not a CONNECT the loop serves
	handoffRefused  = "refused"  // the crawler is refused, or no proxy took it: the server answers why
	handoffUpstream = "upstream" // a fleet proxy failed: the server tries the next
)

// handoff is what the event loop learned of a CONNECT it hands over: who asked for what,
// the proxies tried and how they failed, or why the crawler is refused. The HTTP server
// goes on from there for the connection's first request (Gateway.ServeHTTP), so nothing is
// counted twice: not the crawler's rate limit, not an attempt.
type handoff struct {
	x *exchange
	// refusal, when set, is the answer: the crawler's rate limit refused the request, or
	// no proxy could take it within the wait.
	refusal error
}

// handoffHolder gives a connection's handoff to its first request only.
type handoffHolder struct{ h atomic.Pointer[handoff] }

type handoffKey struct{}

// takeHandoff is the handoff of the connection's first request, once.
func takeHandoff(ctx context.Context) *handoff {
	if hh, _ := ctx.Value(handoffKey{}).(*handoffHolder); hh != nil {
		return hh.h.Swap(nil)
	}
	return nil
}

// handoffContext is the HTTP server's ConnContext: a handed-over connection's handoff
// rides in its context.
func handoffContext(ctx context.Context, c net.Conn) context.Context {
	if hc, ok := c.(*handedConn); ok && hc.handoff != nil {
		hh := &handoffHolder{}
		hh.h.Store(hc.handoff)
		return context.WithValue(ctx, handoffKey{}, hh)
	}
	return ctx
}

// handedConn is a crawler's connection the event loop handed over: it reads first the
// bytes the loop read, then the socket.
type handedConn struct {
	net.Conn
	tcp     *net.TCPConn
	handoff *handoff
	mu      sync.Mutex
	prefix  []byte
}

func (c *handedConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}

// CloseWrite half-closes the connection, as a tunnel's end of stream does.
func (c *handedConn) CloseWrite() error { return c.tcp.CloseWrite() }

// errPrefixPending refuses the socket to a copy while bytes read before it wait.
var errPrefixPending = errors.New("bytes read before the handover are still waiting")

// SyscallConn is the socket's, for a tunnel's copy, once the bytes read before are gone.
func (c *handedConn) SyscallConn() (syscall.RawConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.prefix) > 0 {
		return nil, errPrefixPending
	}
	return c.tcp.SyscallConn()
}

// handoffListener is the HTTP server's listener when the event loop accepts: it yields
// the connections the loop hands over.
type handoffListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{addr: addr, conns: make(chan net.Conn, 1024), done: make(chan struct{})}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	l.drain()
	return nil
}

// drain closes the connections nobody will accept any more.
func (l *handoffListener) drain() {
	for {
		select {
		case c := <-l.conns:
			c.Close()
		default:
			return
		}
	}
}

func (l *handoffListener) Addr() net.Addr { return l.addr }

// give hands c to the server, without blocking the loop: when the server is behind, a
// goroutine waits to; once the listener is closed, c is closed.
func (l *handoffListener) give(c net.Conn) {
	select {
	case <-l.done:
		c.Close()
		return
	case l.conns <- c:
		l.afterClose()
		return
	default:
	}
	go func() {
		select {
		case l.conns <- c:
			l.afterClose()
		case <-l.done:
			c.Close()
		}
	}()
}

// afterClose drains what was queued as the listener closed (a select that could both
// queue and see the listener closed may have queued), which Close's drain may have missed.
func (l *handoffListener) afterClose() {
	select {
	case <-l.done:
		l.drain()
	default:
	}
}
