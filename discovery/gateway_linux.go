package discovery

import (
	"errors"
	"io"
	"net"
	"syscall"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
)

// copyCounting copies src to dst until src ends, counting bytes. It waits for src to have
// data before it copies, and then copies exactly what has arrived: Go splices one TCP
// connection into another through a pipe it holds for the whole call, waits included,
// so a plain copy keeps two pipes (four descriptors and their buffers) for every idle
// tunnel. Waiting first, through the runtime's poller, keeps none: an idle tunnel costs
// its two sockets and two parked goroutines.
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
		avail, err := waitReadable(raw)
		if err != nil {
			return err
		}
		if avail == 0 {
			return nil // the peer closed its side
		}
		n, err := io.Copy(dst, io.LimitReader(src, int64(avail)))
		bytes.Add(float64(n))
		if err != nil {
			return err
		}
		if n < int64(avail) {
			return nil
		}
	}
}

// waitReadable waits until the socket has data or its peer closed, and returns how many
// bytes are queued (0 at end of stream).
func waitReadable(raw syscall.RawConn) (int, error) {
	var avail int
	var opErr error
	err := raw.Read(func(fd uintptr) bool {
		for {
			var n int32
			if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); e != 0 {
				opErr = e
				return true
			}
			if n > 0 {
				avail = int(n)
				return true
			}
			// Nothing queued: nothing has come yet, or the peer closed. A peek tells.
			var b [1]byte
			m, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case errors.Is(err, syscall.EINTR):
				continue
			case errors.Is(err, syscall.EAGAIN):
				return false // the poller calls again once the socket is readable
			case err != nil:
				opErr = err
			default:
				avail = m // 0 at end of stream; 1 if data came between the two calls
			}
			return true
		}
	})
	if err != nil {
		return 0, err
	}
	return avail, opErr
}
