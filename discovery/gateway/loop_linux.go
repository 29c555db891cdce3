//go:build linux

package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/http/httpguts"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// The event loop: CONNECT tunnels served start to end without a goroutine of their own.
//
// Why. A crawler that opens a tunnel per fetch costs a forward proxy an accept, a CONNECT
// to parse, a connection to a fleet proxy and a handful of relayed TLS records, each
// an event. With a goroutine per connection and direction, each event wakes a goroutine,
// and often a thread of Go's runtime for it, with system calls that rouse the runtime's
// monitor: measured, that cost a third more CPU per tunnel than Squid's event loop, and a
// minimal goroutine-per-connection proxy with no leasing at all cost the same. Here each
// loop is one goroutine that waits on an epoll set of its own (itself waited on through
// Go's poller, so the goroutine parks like any other) and makes every system call of its
// sockets directly, none of which blocks: a batch of events costs one wake-up.
//
// What. A loop accepts, reads the CONNECT head, authenticates, leases (inline when the
// server runs alone, since the store answers from memory; on a goroutine in a replica set,
// whose grants may wait on a peer), connects to the fleet proxy, asks it for the tunnel
// and relays both ways until both ends close, with the goroutine path's timeouts (the
// header, the connection, a half-closed tunnel left silent) and its metrics. Everything
// else goes to the HTTP server with the bytes already read (a handoff): a plain request,
// anything the loop does not parse as the server would, a refusal (the server answers it
// as JSON), a crawler that must wait for a slot, and a fleet proxy that failed (the server
// tries the next one; nothing is counted twice).

// Tunnel states.
const (
	stHead     = iota // reading the crawler's request head
	stGranting        // a lease is being granted on a goroutine (replica set)
	stDialing         // connecting to the fleet proxy
	stAnswer          // waiting for the fleet proxy's answer to CONNECT
	stOpen            // relaying
	stDone            // ended, or handed over
)

// loopMaxHead bounds a request head the loop reads; a longer one goes to the HTTP server,
// which answers it as too large (its MaxHeaderBytes, and the slack it reads past them).
const loopMaxHead = 64<<10 + 4096

// loopBuffer is each loop's read buffer, shared by all its tunnels: a tunnel holds bytes
// only while its peer cannot take them.
const loopBuffer = 64 << 10

// pumpBudget bounds the reads one direction of a tunnel makes before the loop turns to
// the others (1 MiB): a fast transfer waits its turn instead of holding the loop.
const pumpBudget = 16

// epollET is EPOLLET as the events word holds it.
const epollET = 1 << 31

// epollExclusive wakes one of the loops waiting on the listener for a new connection.
const epollExclusive = 1 << 28

// loopSet is the gateway's event loops and the listening socket they share.
type loopSet struct {
	g     *Gateway
	lnfd  int
	hand  *handoffListener
	loops []*loop
	wg    sync.WaitGroup
	// stopOnce: stop runs when the context ends and again when the server has drained;
	// the listening socket's descriptor must be closed once, or another's goes with it.
	stopOnce sync.Once
	// bytes are the tunnel byte counters, by direction.
	upBytes, downBytes prometheus.Counter
}

// startLoops takes ln over for the event loops: they accept on a duplicate of its socket
// and ln itself is closed (its descriptor leaves Go's poller). It returns the listener of
// the connections the loops hand over, or false when ln is not a TCP listener.
func (g *Gateway) startLoops(ln net.Listener, n int) (*loopSet, bool) {
	tl, ok := ln.(*net.TCPListener)
	if !ok || n <= 0 {
		return nil, false
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return nil, false
	}
	lnfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) {
		lnfd, derr = dupCloexec(int(fd))
	}); err != nil || derr != nil {
		return nil, false
	}
	// Connections inherit TCP_NODELAY from the listening socket, as Go sets it on each.
	_ = syscall.SetsockoptInt(lnfd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	s := &loopSet{g: g, lnfd: lnfd, hand: newHandoffListener(ln.Addr()),
		upBytes: g.metrics.bytes.WithLabelValues("upstream"), downBytes: g.metrics.bytes.WithLabelValues("downstream")}
	for range n {
		l, err := newLoop(s)
		if err != nil {
			for _, l := range s.loops {
				l.closeFiles()
			}
			_ = syscall.Close(lnfd)
			return nil, false
		}
		s.loops = append(s.loops, l)
	}
	_ = ln.Close()
	for _, l := range s.loops {
		s.wg.Add(1)
		go l.run()
	}
	return s, true
}

// stop ends the loops: no more connections are accepted, and every tunnel they hold is
// closed and its lease released. The listener of handed-over connections stays open for
// the server, whose shutdown closes it: closed first, it would end the server's Serve
// with an error before the drain.
func (s *loopSet) stop() {
	s.stopOnce.Do(func() {
		for _, l := range s.loops {
			l.stop()
		}
		s.wg.Wait()
		_ = syscall.Close(s.lnfd)
	})
}

// each runs fn on every loop's goroutine and waits for it.
func (s *loopSet) each(fn func(l *loop)) {
	var wg sync.WaitGroup
	for _, l := range s.loops {
		wg.Add(1)
		if !l.post(func() { defer wg.Done(); fn(l) }) {
			wg.Done()
		}
	}
	wg.Wait()
}

// loop is one event loop: an epoll set, an eventfd that wakes it for work posted by other
// goroutines, and the connections it serves, by descriptor.
type loop struct {
	s      *loopSet
	g      *Gateway
	epfd   int
	efd    int
	file   *os.File
	conns  []*lconn
	open   map[*ltunnel]struct{}
	buf    []byte
	events []syscall.EpollEvent
	gen    uint32
	// again are the directions that used their budget with more to read, pumped on the
	// loop's next turn.
	again []pumpTurn
	// due are the tunnels' deadlines; wake is the timer set for the earliest (at wakeAt).
	due     deadlineHeap
	wake    *time.Timer
	wakeAt  time.Time
	wakeSet bool
	head    *bufio.Reader
	headR   *bytes.Reader
	// stopped is set on the loop's goroutine when it stops.
	stopped bool

	mu      sync.Mutex
	posted  []func()
	woken   bool
	closing bool
}

func newLoop(s *loopSet) (*loop, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	// Non-blocking, so that os.NewFile gives the set to Go's poller.
	if err := syscall.SetNonblock(epfd, true); err != nil {
		_ = syscall.Close(epfd)
		return nil, err
	}
	r, _, e := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if e != 0 {
		_ = syscall.Close(epfd)
		return nil, e
	}
	l := &loop{s: s, g: s.g, epfd: epfd, efd: int(r), open: map[*ltunnel]struct{}{},
		buf: make([]byte, loopBuffer), events: make([]syscall.EpollEvent, 128)}
	l.headR = bytes.NewReader(nil)
	l.head = bufio.NewReaderSize(l.headR, 4096)
	if e := l.ctl(syscall.EPOLL_CTL_ADD, l.efd, syscall.EPOLLIN|epollET, 0); e != 0 {
		l.closeFiles()
		return nil, e
	}
	if e := l.watchListener(); e != 0 {
		l.closeFiles()
		return nil, e
	}
	l.file = os.NewFile(uintptr(epfd), "gateway-epoll")
	return l, nil
}

func (l *loop) closeFiles() {
	if l.file != nil {
		_ = l.file.Close()
	} else {
		_ = syscall.Close(l.epfd)
	}
	_ = syscall.Close(l.efd)
}

// run is the loop's goroutine: it parks in Go's poller until the epoll set has events,
// then handles them in batches until it has none.
func (l *loop) run() {
	defer l.s.wg.Done()
	defer l.closeFiles()
	rc, err := l.file.SyscallConn()
	if err != nil {
		l.g.log.Error("gateway event loop cannot wait", "error", err)
		return
	}
	_ = rc.Read(func(uintptr) bool {
		for !l.stopped {
			n := l.poll()
			more := l.pumpAgain()
			if !l.fireDue() && n == 0 && !more && !l.stopped {
				l.wakeForDue()
				return false // Go's poller calls again once the set has events
			}
		}
		return true
	})
	if l.wake != nil {
		l.wake.Stop()
	}
}

// poll handles the events ready now, and says how many there were.
func (l *loop) poll() int {
	r, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(l.epfd), uintptr(unsafe.Pointer(&l.events[0])),
		uintptr(len(l.events)), 0, 0, 0)
	if e != 0 {
		return 1 // EINTR: look again
	}
	n := int(r)
	for i := range n {
		if l.stopped {
			break // the rest of the batch is the closed loop's: its sockets are gone
		}
		ev := l.events[i]
		fd := int(ev.Fd)
		switch {
		case fd == l.efd && ev.Pad == 0:
			l.runPosted()
		case fd == l.s.lnfd && ev.Pad == 0:
			l.accept()
		default:
			if fd < len(l.conns) {
				if c := l.conns[fd]; c != nil && c.gen == uint32(ev.Pad) {
					l.event(c, ev.Events)
				}
			}
		}
	}
	return n
}

// post runs fn on the loop's goroutine; false when the loop has stopped (fn never runs).
func (l *loop) post(fn func()) bool {
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		return false
	}
	l.posted = append(l.posted, fn)
	wake := !l.woken
	l.woken = true
	l.mu.Unlock()
	if wake {
		one := uint64(1)
		_, _, _ = syscall.RawSyscall(syscall.SYS_WRITE, uintptr(l.efd), uintptr(unsafe.Pointer(&one)), 8)
	}
	return true
}

func (l *loop) runPosted() {
	var v uint64
	_, _, _ = syscall.RawSyscall(syscall.SYS_READ, uintptr(l.efd), uintptr(unsafe.Pointer(&v)), 8)
	l.mu.Lock()
	fns := l.posted
	l.posted, l.woken = nil, false
	l.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

// stop asks the loop to close everything it holds and return.
func (l *loop) stop() {
	if !l.post(l.shutdown) {
		return
	}
}

func (l *loop) shutdown() {
	_ = l.ctl(syscall.EPOLL_CTL_DEL, l.s.lnfd, 0, 0)
	for t := range l.open {
		l.end(t, "canceled")
	}
	l.mu.Lock()
	l.closing = true
	fns := l.posted
	l.posted = nil
	l.mu.Unlock()
	// Work posted before the loop closed runs: a lease granted meanwhile is released.
	for _, fn := range fns {
		fn()
	}
	l.stopped = true
}

// lconn is one socket of a tunnel: the crawler's or the fleet proxy's.
type lconn struct {
	fd  int
	gen uint32
	t   *ltunnel
	// out are bytes for this socket that it could not take yet.
	out []byte
	// eof: its peer's bytes have all come (this socket is shut for writing once out is
	// written); ended: this socket's own bytes have.
	eof, ended bool
}

// ltunnel is one CONNECT on a loop, from its head to its end.
type ltunnel struct {
	l          *loop
	state      int
	client, up *lconn
	// in is what the crawler sent: its head (head bytes long), then what came after it.
	in   []byte
	head int
	// answer is the fleet proxy's answer to CONNECT as it comes.
	answer []byte
	x      *exchange
	// hostport is what the crawler asked to reach.
	hostport string
	lease    *discovery.LeaseResponse
	start    time.Time
	// timer bounds the state (the head, the connection to the fleet proxy); idle closes a
	// half-closed tunnel left silent; keep turns keepalive on for a lasting tunnel.
	timer, idle, keep *deadline
	// hangup: the crawler's end of stream may have come with its head.
	hangup bool
	// cancel ends a wait for a slot on the crawler's leaving.
	cancel context.CancelFunc
	ended  int
	moved  int64
}

// ctl adds, changes or removes fd in the loop's set; gen rides in the event's data.
func (l *loop) ctl(op, fd int, events uint32, gen uint32) syscall.Errno {
	ev := syscall.EpollEvent{Events: events, Fd: int32(fd), Pad: int32(gen)}
	_, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_CTL, uintptr(l.epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(&ev)), 0, 0)
	return e
}

// watch registers a new socket of t: edge-triggered, so a socket is reported once per
// change and the loop reads until it has drained what came.
func (l *loop) watch(fd int, t *ltunnel) (*lconn, syscall.Errno) {
	l.gen++
	if l.gen == 0 {
		l.gen = 1 // 0 is the listener's and the eventfd's
	}
	c := &lconn{fd: fd, gen: l.gen, t: t}
	if fd >= len(l.conns) {
		grown := make([]*lconn, max(fd+1, 2*len(l.conns)))
		copy(grown, l.conns)
		l.conns = grown
	}
	if e := l.ctl(syscall.EPOLL_CTL_ADD, fd, syscall.EPOLLIN|syscall.EPOLLOUT|syscall.EPOLLRDHUP|epollET, c.gen); e != 0 {
		return nil, e
	}
	l.conns[fd] = c
	return c, 0
}

// forget closes c's socket, which leaves the set with it.
func (l *loop) forget(c *lconn) {
	if c == nil || c.fd < 0 {
		return
	}
	if l.conns[c.fd] == c {
		l.conns[c.fd] = nil
	}
	_, _, _ = syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(c.fd), 0, 0)
	c.fd = -1
}

// acceptBudget bounds the connections one loop takes in a turn: the listener is level
// triggered, so those left are reported again, to whichever loop looks first.
const acceptBudget = 32

// watchListener adds the listening socket to the loop's set.
func (l *loop) watchListener() syscall.Errno {
	if e := l.ctl(syscall.EPOLL_CTL_ADD, l.s.lnfd, syscall.EPOLLIN|epollExclusive, 0); e == 0 {
		return 0
	}
	// A kernel before 4.5 has no EPOLLEXCLUSIVE: every loop is woken, one accepts.
	return l.ctl(syscall.EPOLL_CTL_ADD, l.s.lnfd, syscall.EPOLLIN, 0)
}

// accept takes the connections waiting, up to acceptBudget.
func (l *loop) accept() {
	for range acceptBudget {
		if l.stopped {
			return
		}
		r, _, e := syscall.RawSyscall6(syscall.SYS_ACCEPT4, uintptr(l.s.lnfd), 0, 0, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0, 0)
		switch e {
		case 0:
		case syscall.EAGAIN:
			return
		case syscall.EINTR, syscall.ECONNABORTED:
			continue
		case syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM:
			// Out of descriptors: stop accepting for a moment (the listener is level
			// triggered, and would be reported again at once), as Go's server backs off.
			l.g.log.Warn("gateway cannot accept a connection; pausing accepts", "error", e)
			_ = l.ctl(syscall.EPOLL_CTL_DEL, l.s.lnfd, 0, 0)
			time.AfterFunc(100*time.Millisecond, func() {
				l.post(func() {
					if e := l.watchListener(); e != 0 {
						l.g.log.Error("gateway loop cannot accept again", "error", e)
					}
				})
			})
			return
		default:
			l.g.log.Warn("gateway accept failed", "error", e)
			return
		}
		fd := int(r)
		t := &ltunnel{l: l, state: stHead, start: time.Now()}
		c, e := l.watch(fd, t)
		if e != 0 {
			_ = syscall.Close(fd)
			continue
		}
		t.client = c
		l.open[t] = struct{}{}
		// The head's bound, as the server's ReadHeaderTimeout: a crawler that sends
		// nothing holds nothing.
		l.arm(t, l.g.headerTimeout, func() { l.end(t, "") })
		// Nothing is read yet: a head already here is reported by the set at once.
	}
}

// arm bounds t's current state: after d, fn runs on the loop unless the state moved on
// (disarm) first.
func (l *loop) arm(t *ltunnel, d time.Duration, fn func()) {
	l.cancel(t.timer)
	t.timer = l.after(d, fn)
}

func (l *loop) disarm(t *ltunnel) {
	l.cancel(t.timer)
	t.timer = nil
}

// event handles what the set reported for c.
func (l *loop) event(c *lconn, ev uint32) {
	t := c.t
	hangup := ev&(syscall.EPOLLERR|syscall.EPOLLHUP|syscall.EPOLLRDHUP) != 0
	switch t.state {
	case stHead:
		if ev&syscall.EPOLLIN != 0 || hangup {
			l.readHead(t, hangup)
		}
	case stGranting:
		if hangup && l.left(c, ev) {
			l.end(t, "canceled")
		}
	case stDialing, stAnswer:
		if c == t.client {
			// The crawler's bytes wait in its socket until the tunnel opens; its
			// leaving ends the attempt, as it ends the server's request.
			if hangup && l.left(c, ev) {
				l.end(t, "canceled")
			}
			return
		}
		if t.state == stDialing {
			l.connected(t)
		} else {
			l.readAnswer(t, hangup)
		}
	case stOpen:
		peer := t.up
		if c == t.up {
			peer = t.client
		}
		if ev&(syscall.EPOLLIN|syscall.EPOLLERR|syscall.EPOLLHUP|syscall.EPOLLRDHUP) != 0 {
			l.pump(t, c, peer, hangup)
		}
		if t.state == stOpen && len(c.out) > 0 && ev&(syscall.EPOLLOUT|syscall.EPOLLERR|syscall.EPOLLHUP) != 0 {
			l.pump(t, peer, c, true)
		}
	}
}

// left says whether the crawler has gone before its tunnel opened: its connection failed,
// or it ended its stream with nothing left unread. One that sent its first bytes and then
// half-closed waits for its answer, as the server lets it.
func (l *loop) left(c *lconn, ev uint32) bool {
	return ev&(syscall.EPOLLERR|syscall.EPOLLHUP) != 0 || peerClosed(c.fd)
}

// peerClosed says whether fd's peer has ended its stream and nothing waits to be read.
func peerClosed(fd int) bool {
	r, e := peek(fd)
	return e == 0 && r == 0 || e != 0 && e != syscall.EAGAIN && e != syscall.EINTR
}

// peek looks at fd's next byte without taking it or waiting: r is 1 if one is there, 0 at
// the end of the peer's stream, and e is EAGAIN if neither has come yet.
func peek(fd int) (r uintptr, e syscall.Errno) {
	var b [1]byte
	r, _, e = syscall.RawSyscall6(syscall.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return r, e
}

// readHead reads the crawler's request head, and acts on it once it is whole. A read
// shorter than asked took all there was, and what comes later is a new event, unless the
// crawler's end of stream came with it (hangup), which only a further read reports.
func (l *loop) readHead(t *ltunnel, hangup bool) {
	c := t.client
	for t.state == stHead {
		chunk := l.buf[:min(len(l.buf), loopMaxHead+1-len(t.in))]
		n, e := rawRead(c.fd, chunk)
		switch {
		case e == syscall.EAGAIN:
			return
		case e != 0 || n == 0:
			// Gone before asking anything whole: as the server, no answer.
			l.end(t, "")
			return
		}
		from := max(len(t.in)-2, 0)
		t.in = append(t.in, chunk[:n]...)
		if !isConnectPrefix(t.in) {
			l.handoff(t, nil, handoffRequest) // a plain request, or not HTTP: the server's
			return
		}
		if end := headEnd(t.in, from); end >= 0 {
			t.head = end
			t.hangup = hangup
			l.headRead(t)
			return
		}
		if len(t.in) > loopMaxHead {
			l.handoff(t, nil, handoffRequest)
			return
		}
		if n < len(chunk) && !hangup {
			return // drained: more is a new event
		}
	}
}

// headEnd is where the head in b ends (after its empty line), looking from from on, or
// -1. A line ends in CRLF or, as Go's reader also takes it, a bare LF.
func headEnd(b []byte, from int) int {
	for i := from; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		switch {
		case i+1 < len(b) && b[i+1] == '\n':
			return i + 2
		case i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n':
			return i + 3
		}
	}
	return -1
}

// parsedUpTo says whether the reader r, over the first end bytes of a head, read them all
// and no more: what the loop takes for the head is what the server would read as one.
func parsedUpTo(r *bufio.Reader, under *bytes.Reader) bool {
	return r.Buffered() == 0 && under.Len() == 0
}

// isConnectPrefix says whether b can begin a CONNECT request.
func isConnectPrefix(b []byte) bool {
	const m = "CONNECT "
	n := min(len(b), len(m))
	return string(b[:n]) == m[:n]
}

// headRead parses a whole CONNECT head as the HTTP server would, and goes on to lease
// when the loop can serve it; the server gets anything else.
func (l *loop) headRead(t *ltunnel) {
	l.disarm(t)
	l.headR.Reset(t.in[:t.head])
	l.head.Reset(l.headR)
	req, err := http.ReadRequest(l.head)
	if err != nil || !parsedUpTo(l.head, l.headR) || !servable(req) {
		l.handoff(t, nil, handoffRequest)
		return
	}
	g := l.g
	// Its span is the handler's once handed over; the loop records its own (record).
	x := &exchange{span: trace.SpanFromContext(context.Background())}
	if ae := g.identify(req.Header, x); ae != nil || !g.ops.Loaded() {
		l.handoff(t, nil, handoffRefused)
		return
	}
	if _, port, err := net.SplitHostPort(req.Host); err != nil || port == "" {
		l.handoff(t, nil, handoffRefused)
		return
	}
	target, err := discovery.NormalizeTarget(req.Host)
	if err != nil {
		l.handoff(t, nil, handoffRefused)
		return
	}
	x.target = target
	t.hostport = req.Host
	t.x = x
	if t.hangup && peerClosed(t.client.fd) {
		// The crawler sent its head and left, with nothing after it: as the server's
		// request is, it is cancelled before it takes a lease.
		l.end(t, "canceled")
		return
	}
	if x.client != nil {
		if ae := g.ops.Throttle(x.client); ae != nil {
			l.handoff(t, &handoff{x: x, refusal: ae}, handoffRefused)
			return
		}
	}
	l.grant(t)
}

// servable says whether the loop serves req as the HTTP server would: a CONNECT of
// HTTP/1.x with nothing the server checks or answers in its own way (a Host header it
// refuses, a body, Expect).
func servable(req *http.Request) bool {
	if req.Method != http.MethodConnect || req.ProtoMajor != 1 || req.ContentLength != 0 ||
		len(req.TransferEncoding) > 0 || req.Header.Get("Expect") != "" {
		return false
	}
	hosts := req.Header["Host"]
	if len(hosts) > 1 || len(hosts) == 1 && !httpguts.ValidHostHeader(hosts[0]) {
		return false
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return false
			}
		}
	}
	return true
}

// grant leases a proxy for t: inline when the server answers from memory, else on a
// goroutine whose answer comes back to the loop.
func (l *loop) grant(t *ltunnel) {
	g := l.g
	want := t.x.want(g.cfg.LeaseTTL)
	freed := g.ops.Freed()
	if g.ops.Alone() {
		lease, err := g.ops.Grant(context.Background(), want, t.x.skip)
		l.granted(t, lease, err, freed)
		return
	}
	t.state = stGranting
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), g.cfg.ConnectTimeout)
		lease, err := g.ops.Grant(ctx, want, t.x.skip)
		cancel()
		if !l.post(func() { l.granted(t, lease, err, freed) }) && err == nil {
			g.release(t.x.auth, lease.LeaseID)
		}
	}()
}

// granted goes on with a lease. A refused grant waits for a slot as the server's requests
// do (waitForSlot, in the queue the API's acquires share), on a goroutine that gives the
// loop the lease it gets, or a refusal the server then answers; freed is the store's count
// of freeing changes before the grant. Waiting here, not in the server, keeps a tunnel that
// waited on the loop: one crawler over capacity would otherwise send most tunnels through
// the server, each handed over, as every slot freed goes to the one waiting.
func (l *loop) granted(t *ltunnel, lease *discovery.LeaseResponse, err error, freed uint64) {
	if t.state != stHead && t.state != stGranting {
		if err == nil {
			l.release(t.x.auth, lease.LeaseID) // the crawler left meanwhile
		}
		return
	}
	if err == nil {
		l.leased(t, lease)
		return
	}
	g := l.g
	t.state = stGranting
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	go func() {
		lease, err := g.waitForSlot(ctx, t.x, err, freed)
		if !l.post(func() { l.waited(t, lease, err) }) && err == nil {
			g.release(t.x.auth, lease.LeaseID)
		}
	}()
}

// waited goes on with the lease a wait got, or hands its refusal to the server to answer.
func (l *loop) waited(t *ltunnel, lease *discovery.LeaseResponse, err error) {
	if t.state != stGranting {
		if err == nil {
			l.release(t.x.auth, lease.LeaseID) // the crawler left meanwhile
		}
		return
	}
	if err != nil {
		l.handoff(t, &handoff{x: t.x, refusal: err}, handoffRefused)
		return
	}
	l.leased(t, lease)
}

// leased holds a granted lease and connects to its proxy.
func (l *loop) leased(t *ltunnel, lease *discovery.LeaseResponse) {
	t.x.tried = append(t.x.tried, lease.Proxy.Namespace+"/"+lease.Proxy.Name)
	l.g.hold(lease.LeaseID, t.x.auth)
	t.lease = lease
	l.dial(t)
}

// release ends a lease: inline when the server answers from memory.
func (l *loop) release(auth, id string) {
	g := l.g
	if !g.ops.Alone() {
		go g.release(auth, id)
		return
	}
	g.unhold(id)
	if err := g.ops.ReleaseLease(context.Background(), auth, id); err != nil {
		g.log.Debug("lease not released; it frees up when it expires", "lease", id, "error", err)
	}
}

// dial connects to the leased proxy, without waiting: the set reports the connection.
func (l *loop) dial(t *ltunnel) {
	p := t.lease.Proxy
	id := p.ID()
	sa, family, ok := sockaddr(p.IP, int(p.Port))
	if !ok {
		// Not an address: the server's dialer resolves it.
		l.upFailed(t, nil)
		return
	}
	r, _, e := syscall.RawSyscall(syscall.SYS_SOCKET, uintptr(family), syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if e != 0 {
		l.upFailed(t, dialFailure(id, e, true))
		return
	}
	fd := int(r)
	one := int32(1)
	_, _, _ = syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, uintptr(fd), syscall.IPPROTO_TCP, syscall.TCP_NODELAY,
		uintptr(unsafe.Pointer(&one)), 4, 0)
	_, _, e = syscall.RawSyscall(syscall.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa[0])), uintptr(len(sa)))
	if e != 0 && e != syscall.EINPROGRESS {
		_ = syscall.Close(fd)
		l.upFailed(t, dialFailure(id, e, true))
		return
	}
	c, e := l.watch(fd, t)
	if e != 0 {
		_ = syscall.Close(fd)
		l.upFailed(t, dialFailure(id, e, true))
		return
	}
	t.up = c
	c.out = []byte(connectRequest(t.lease, t.hostport))
	t.state = stDialing
	// One bound for the connection and the answer, as the server's dial has.
	l.arm(t, l.g.cfg.ConnectTimeout, func() {
		if t.state == stDialing {
			l.upFailed(t, dialFailure(id, context.DeadlineExceeded, true))
			return
		}
		l.upFailed(t, ioFailure(id, os.ErrDeadlineExceeded))
	})
}

// connected sends CONNECT once the connection to the fleet proxy is made.
func (l *loop) connected(t *ltunnel) {
	id := t.lease.Proxy.ID()
	var v int32
	size := uint32(4)
	_, _, e := syscall.RawSyscall6(syscall.SYS_GETSOCKOPT, uintptr(t.up.fd), syscall.SOL_SOCKET, syscall.SO_ERROR,
		uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&size)), 0)
	switch {
	case e != 0:
		l.upFailed(t, dialFailure(id, e, true))
		return
	case v != 0:
		l.upFailed(t, dialFailure(id, syscall.Errno(v), true))
		return
	}
	n, e := rawWrite(t.up.fd, t.up.out)
	switch {
	case e == syscall.EAGAIN || e == syscall.ENOTCONN:
		return // not connected yet: the set reports it
	case e != 0:
		l.upFailed(t, ioFailure(id, e))
		return
	}
	t.up.out = t.up.out[n:]
	if len(t.up.out) > 0 {
		return // the rest once the socket takes it
	}
	t.up.out = nil
	t.state = stAnswer
	l.readAnswer(t, true)
}

// readAnswer reads the fleet proxy's answer to CONNECT, and opens the tunnel on a 2xx
// (hangup as readHead's).
func (l *loop) readAnswer(t *ltunnel, hangup bool) {
	id := t.lease.Proxy.ID()
	for t.state == stAnswer {
		chunk := l.buf[:min(len(l.buf), loopMaxHead+1-len(t.answer))]
		n, e := rawRead(t.up.fd, chunk)
		switch {
		case e == syscall.EAGAIN:
			return
		case e != 0:
			l.upFailed(t, ioFailure(id, e))
			return
		case n == 0:
			l.upFailed(t, ioFailure(id, net.ErrClosed))
			return
		}
		from := max(len(t.answer)-2, 0)
		t.answer = append(t.answer, chunk[:n]...)
		end := headEnd(t.answer, from)
		if end < 0 {
			if len(t.answer) > loopMaxHead {
				l.upFailed(t, ioFailure(id, net.ErrClosed))
				return
			}
			if n < len(chunk) && !hangup {
				return
			}
			continue
		}
		l.headR.Reset(t.answer[:end])
		l.head.Reset(l.headR)
		resp, err := http.ReadResponse(l.head, &http.Request{Method: http.MethodConnect})
		if err == nil && !parsedUpTo(l.head, l.headR) {
			err = errAnswerUnread
		}
		if err != nil {
			l.upFailed(t, ioFailure(id, err))
			return
		}
		if f := connectRefused(id, resp); f != nil {
			l.upFailed(t, f)
			return
		}
		l.opened(t, t.answer[end:])
	}
}

// upFailed ends an attempt on a fleet proxy: its connection is closed, its lease
// released, the failure recorded (f nil: the loop could not dial it), and the server
// takes the request on from there, trying the next proxy or answering why none carried it.
func (l *loop) upFailed(t *ltunnel, f *upstreamFailure) {
	l.disarm(t)
	l.forget(t.up)
	t.up = nil
	l.release(t.x.auth, t.lease.LeaseID)
	if f != nil {
		l.g.failed(t.x, *f)
	} else {
		// The server leases again: this attempt is not one.
		t.x.tried = t.x.tried[:len(t.x.tried)-1]
	}
	t.lease = nil
	l.handoff(t, &handoff{x: t.x}, handoffUpstream)
}

// opened answers the crawler's CONNECT and starts relaying: the fleet proxy's early bytes
// after the 200, the crawler's after its head.
func (l *loop) opened(t *ltunnel, early []byte) {
	l.disarm(t)
	g := l.g
	proxyID := t.lease.Proxy.ID()
	t.client.out = append([]byte("HTTP/1.1 200 Connection established\r\n"+ProxyHeader+": "+proxyID+"\r\n\r\n"), early...)
	if len(t.in) > t.head {
		t.up.out = append(t.up.out, t.in[t.head:]...)
	}
	t.in, t.answer = nil, nil
	t.state = stOpen
	g.metrics.connectSeconds.Observe(time.Since(t.start).Seconds())
	g.metrics.tunnels.Inc()
	l.record(t, "ok")
	up := t.up
	t.keep = l.after(g.cfg.KeepAliveAfter, func() {
		if t.state == stOpen && up.fd >= 0 {
			one := int32(1)
			_, _, _ = syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, uintptr(up.fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE,
				uintptr(unsafe.Pointer(&one)), 4, 0)
		}
	})
	l.pump(t, t.up, t.client, true)
	if t.state == stOpen {
		l.pump(t, t.client, t.up, true)
	}
}

// record counts a CONNECT the loop answered itself, as the server's handler does, with a
// span that began with the request.
func (l *loop) record(t *ltunnel, outcome string) {
	g := l.g
	client := t.x.clientName()
	g.metrics.requests.WithLabelValues(client, "connect", outcome).Inc()
	_, span := g.tracer.Start(context.Background(), "gateway CONNECT", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(t.start))
	attrs := []attribute.KeyValue{attribute.String("server.address", t.x.target),
		attribute.String("proxyfleet.gateway.outcome", outcome), attribute.String("proxyfleet.client", client),
		attribute.Int("proxyfleet.gateway.attempts", len(t.x.tried))}
	if t.lease != nil {
		attrs = append(attrs, attribute.String("proxyfleet.proxy", t.lease.Proxy.ID()))
	}
	span.SetAttributes(attrs...)
	if outcome != "ok" {
		span.SetStatus(otelcodes.Error, outcome)
	}
	span.End()
}

// pumpTurn is a direction of a tunnel waiting for its next turn.
type pumpTurn struct {
	t        *ltunnel
	src, dst *lconn
}

// pumpAgain gives the directions that used their budget another turn, and says whether
// there were any.
func (l *loop) pumpAgain() bool {
	if len(l.again) == 0 {
		return false
	}
	turns := l.again
	l.again = nil
	for _, p := range turns {
		if p.t.state == stOpen {
			l.pump(p.t, p.src, p.dst, true)
		}
	}
	return true
}

// pump moves what src sent to dst: first what dst could not take before, then src's
// bytes until src has none or dst takes no more. Unless full, a read shorter than the
// buffer ends it (see readHead): full when src may have ended, or nothing says what came.
func (l *loop) pump(t *ltunnel, src, dst *lconn, full bool) {
	counter := l.s.upBytes
	if src == t.up {
		counter = l.s.downBytes
	}
	for reads := 0; t.state == stOpen; reads++ {
		if reads == pumpBudget {
			// More may be waiting, which no new event will say: a turn later.
			l.again = append(l.again, pumpTurn{t, src, dst})
			return
		}
		if len(dst.out) > 0 {
			n, e := rawWrite(dst.fd, dst.out)
			switch {
			case e == syscall.EAGAIN:
				return // the set reports dst when it takes more
			case e != 0:
				l.end(t, "")
				return
			}
			dst.out = dst.out[n:]
			if len(dst.out) > 0 {
				return
			}
			dst.out = nil
			if dst.eof {
				shutWrite(dst.fd)
			}
		}
		if src.ended {
			return
		}
		n, e := rawRead(src.fd, l.buf)
		switch {
		case e == syscall.EAGAIN:
			return
		case e != 0:
			l.end(t, "") // a reset: both sides close, as the goroutine path does
			return
		case n == 0:
			src.ended, dst.eof = true, true
			if len(dst.out) == 0 {
				shutWrite(dst.fd)
			}
			l.directionEnded(t)
			return
		}
		counter.Add(float64(n))
		t.moved += int64(n)
		w, e := rawWrite(dst.fd, l.buf[:n])
		switch {
		case e == syscall.EAGAIN:
			w = 0
		case e != 0:
			l.end(t, "")
			return
		}
		if w < n {
			dst.out = append([]byte(nil), l.buf[w:n]...)
			return
		}
		if n < len(l.buf) && !full {
			// Drained: what comes next is a new event (edge-triggered, and the read
			// took all there was).
			return
		}
	}
}

// directionEnded: a tunnel whose two directions have ended closes; one whose one
// direction has gets HalfClosedTimeout of silence to finish.
func (l *loop) directionEnded(t *ltunnel) {
	t.ended++
	if t.ended == 2 {
		l.end(t, "")
		return
	}
	var arm func(last int64)
	arm = func(last int64) {
		t.idle = l.after(l.g.cfg.HalfClosedTimeout, func() {
			switch {
			case t.state != stOpen:
			case t.moved != last:
				arm(t.moved)
			default:
				l.end(t, "")
			}
		})
	}
	arm(t.moved)
}

// end closes t and releases its lease. outcome, when not empty, is counted (a CONNECT
// that ended before its tunnel opened, with no answer).
func (l *loop) end(t *ltunnel, outcome string) {
	if t.state == stDone {
		return
	}
	wasOpen := t.state == stOpen
	if outcome != "" && t.x != nil && !wasOpen {
		l.record(t, outcome)
	}
	t.state = stDone
	if t.cancel != nil {
		t.cancel()
	}
	l.disarm(t)
	l.cancel(t.idle)
	l.cancel(t.keep)
	l.forget(t.client)
	l.forget(t.up)
	delete(l.open, t)
	if wasOpen {
		l.g.metrics.tunnels.Dec()
	}
	if t.lease != nil {
		l.release(t.x.auth, t.lease.LeaseID)
		t.lease = nil
	}
}

// handoff gives the crawler's connection to the HTTP server, with the bytes read from
// it and what the loop learned (h; nil: the server starts from the head), for reason.
func (l *loop) handoff(t *ltunnel, h *handoff, reason string) {
	l.g.metrics.handoffs.WithLabelValues(reason).Inc()
	c := t.client
	prefix := t.in
	t.in = nil
	t.state = stDone
	l.disarm(t)
	delete(l.open, t)
	fd := c.fd
	if l.conns[fd] == c {
		l.conns[fd] = nil
	}
	c.fd = -1
	// Out of the set first: the server's descriptor is a duplicate of this one, which
	// the set would otherwise go on reporting.
	_ = l.ctl(syscall.EPOLL_CTL_DEL, fd, 0, 0)
	f := os.NewFile(uintptr(fd), "gateway-crawler")
	nc, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		return
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return
	}
	l.s.hand.give(&handedConn{Conn: tc, tcp: tc, prefix: prefix, handoff: h})
}

func rawRead(fd int, b []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e == syscall.EINTR {
		return rawRead(fd, b)
	}
	return int(r), e
}

func rawWrite(fd int, b []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e == syscall.EINTR {
		return rawWrite(fd, b)
	}
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

func shutWrite(fd int) {
	_, _, _ = syscall.RawSyscall(syscall.SYS_SHUTDOWN, uintptr(fd), syscall.SHUT_WR, 0)
}

func dupCloexec(fd int) (int, error) {
	r, _, e := syscall.RawSyscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, 0)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// errAnswerUnread: the answer's head, as the loop found it, is not what Go's reader reads.
var errAnswerUnread = errors.New("the answer to CONNECT is not one head")

// sockaddr is ip:port as the kernel takes it, and its address family.
func sockaddr(ip string, port int) ([]byte, int, bool) {
	a := net.ParseIP(ip)
	if a == nil || port <= 0 || port > 65535 {
		return nil, 0, false
	}
	if v4 := a.To4(); v4 != nil {
		sa := make([]byte, syscall.SizeofSockaddrInet4)
		*(*uint16)(unsafe.Pointer(&sa[0])) = syscall.AF_INET
		sa[2], sa[3] = byte(port>>8), byte(port)
		copy(sa[4:8], v4)
		return sa, syscall.AF_INET, true
	}
	sa := make([]byte, syscall.SizeofSockaddrInet6)
	*(*uint16)(unsafe.Pointer(&sa[0])) = syscall.AF_INET6
	sa[2], sa[3] = byte(port>>8), byte(port)
	copy(sa[8:24], a.To16())
	return sa, syscall.AF_INET6, true
}
