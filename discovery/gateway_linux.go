package discovery

import (
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
