package gateway

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
)

// copyCounting copies src to dst until src ends, counting bytes. It waits for data
// through the runtime's poller without holding a buffer, then reads what came into a
// buffer borrowed from a pool and writes it on: an idle tunnel costs its two sockets and
// two parked goroutines, nothing more. (Go's own copy between TCP connections splices
// through a pipe it holds for the whole call, waits included: two pipes, four
// descriptors, for every idle tunnel.)
func copyCounting(dst, src net.Conn, bytes prometheus.Counter) error {
	sc, ok := src.(syscall.Conn)
	if !ok {
		return copyChunks(dst, src, bytes)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return copyChunks(dst, src, bytes)
	}
	for {
		var (
			buf   *[]byte
			n     int
			rdErr error
		)
		err := raw.Read(func(fd uintptr) bool {
			b := tunnelBuffers.Get().(*[]byte)
			for {
				m, e := syscall.Read(int(fd), *b)
				switch {
				case errors.Is(e, syscall.EINTR):
					continue
				case errors.Is(e, syscall.EAGAIN):
					tunnelBuffers.Put(b)
					return false // the poller calls again once there is data
				}
				buf, n, rdErr = b, m, e
				return true
			}
		})
		if err != nil {
			return err
		}
		if rdErr != nil || n <= 0 {
			tunnelBuffers.Put(buf)
			return rdErr // nil at end of stream
		}
		_, err = dst.Write((*buf)[:n])
		tunnelBuffers.Put(buf)
		bytes.Add(float64(n))
		if err != nil {
			return err
		}
	}
}

// tunnelBuffers lend 32 KiB to a tunnel for one read and write.
var tunnelBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// Listen listens for crawlers on addr, TCP keepalive on for every connection, as
// Go's listeners do by default (15 s idle, then every 15 s, 9 probes: a crawler gone
// without a word frees its tunnel's slot within three minutes). Linux gives a connection
// the keepalive settings of the socket that accepted it, so they are set once here
// instead of by four system calls on every connection, which Go's listener makes: a
// crawler that opens a tunnel per fetch opens a connection per fetch.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = setKeepAlive(int(fd)) }); err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(ctx, "tcp", addr)
}

// setKeepAlive sets Go's default keepalive on socket fd.
func setKeepAlive(fd int) error {
	for _, o := range []struct{ level, opt, v int }{
		{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, 15},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, 15},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, 9},
	} {
		if err := syscall.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			return err
		}
	}
	return nil
}
