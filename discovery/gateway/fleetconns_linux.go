package gateway

import (
	"net"
	"syscall"
)

// alive says whether an idle pooled connection is still open and silent: a peek that
// does not wait, one system call. The standard transport learns of a proxy closing an
// idle connection from the read it keeps pending on it; this pool keeps none (that read
// is a goroutine and a wake-up per request), so it looks before reusing one.
func alive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	err = rc.Read(func(fd uintptr) bool {
		// Nothing to read is the only sign of life: an end (0 bytes), an error, or bytes
		// nobody asked for all mean the connection cannot carry a request.
		_, e := peek(int(fd))
		open = e == syscall.EAGAIN
		return true
	})
	return err == nil && open
}
