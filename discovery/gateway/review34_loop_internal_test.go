//go:build linux

package gateway

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// review34AloneOps is the mock as a server without peers: the loop grants inline.
type review34AloneOps struct{ *leaseOpsMock }

func (review34AloneOps) Alone() bool { return true }

// review34AcceptQueue is how many connections wait in listening socket fd's accept queue
// (TCP_INFO's unacked, for a listening socket).
func review34AcceptQueue(fd int) uint32 {
	var info syscall.TCPInfo
	size := uint32(syscall.SizeofTCPInfo)
	_, _, e := syscall.Syscall6(syscall.SYS_GETSOCKOPT, uintptr(fd), syscall.IPPROTO_TCP, syscall.TCP_INFO,
		uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0)
	if e != 0 {
		return 0
	}
	return info.Unacked
}

// TestReview34LoopAcceptsAfterItStopped: the loop handles the rest of a batch of events
// after the posted shutdown in it has run. A connection that came in while the loop was
// busy (here: an inline grant; in production any batch at a stop under load) is reported
// in the same batch as the eventfd, after it: shutdown takes the listener out of the set,
// ends every tunnel and sets stopped, and then accept() takes the connection, registers a
// tunnel and arms its header timeout on a loop that is about to close its epoll set. No
// one ever closes that socket: the crawler hangs, with neither an answer nor a reset, for
// as long as the process lives (the listener's own close, which would reset a connection
// still queued, no longer concerns it). Expected: once Serve returned, the connection is
// closed or reset.
func TestReview34LoopAcceptsAfterItStopped(t *testing.T) {
	entered, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ops := review34AloneOps{&leaseOpsMock{grantFn: func(context.Context, discovery.Want, func(string) bool) (*discovery.LeaseResponse, error) {
		once.Do(func() { close(entered); <-unblock })
		return nil, &discovery.NoMatch{}
	}}}
	g := mockGateway(ops, Config{Wait: -1, Loops: 1})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); _ = g.Serve(ctx, ln) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			close(unblock)
		}
		cancel()
		<-served
	})
	var s *loopSet
	require.Eventually(t, func() bool { g.mu.Lock(); s = g.loops; g.mu.Unlock(); return s != nil }, 5*time.Second, time.Millisecond)

	first, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer first.Close()
	_, err = io.WriteString(first, "CONNECT site.test:443 HTTP/1.1\r\nHost: site.test:443\r\n\r\n")
	require.NoError(t, err)
	select {
	case <-entered: // the loop is busy granting inline
	case <-time.After(10 * time.Second):
		t.Fatal("the loop never granted")
	}
	s.loops[0].stop()
	second, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer second.Close()
	require.Eventually(t, func() bool { return review34AcceptQueue(s.lnfd) == 1 }, 5*time.Second, time.Millisecond)
	close(unblock)
	stopped = true
	cancel()
	<-served

	require.NoError(t, second.SetReadDeadline(time.Now().Add(3*time.Second)))
	_, err = second.Read(make([]byte, 1))
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection outlived the gateway: %v", err)
}
