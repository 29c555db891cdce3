package gateway

import (
	"net"
	"sync"
	"syscall"
)

// UpstreamKeepAlive says, for each open tunnel, whether its fleet proxy's connection has
// TCP keepalive on.
func (g *Gateway) UpstreamKeepAlive() []bool {
	g.mu.Lock()
	var out []bool
	for t := range g.tunnels {
		on := false
		if tc, ok := t.up.(*net.TCPConn); ok {
			if raw, err := tc.SyscallConn(); err == nil {
				_ = raw.Control(func(fd uintptr) {
					v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
					on = err == nil && v == 1
				})
			}
		}
		out = append(out, on)
	}
	s := g.loops
	// Unlocked: a loop holding a lease takes the lock.
	g.mu.Unlock()
	if s != nil {
		var mu sync.Mutex
		s.each(func(l *loop) {
			for t := range l.open {
				if t.state == stOpen {
					v, err := syscall.GetsockoptInt(t.up.fd, syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
					mu.Lock()
					out = append(out, err == nil && v == 1)
					mu.Unlock()
				}
			}
		})
	}
	return out
}

// LoopTunnels is how many tunnels g's event loops serve now, in any state.
func (g *Gateway) LoopTunnels() int {
	g.mu.Lock()
	s := g.loops
	g.mu.Unlock()
	if s == nil {
		return 0
	}
	var mu sync.Mutex
	n := 0
	s.each(func(l *loop) {
		mu.Lock()
		n += len(l.open)
		mu.Unlock()
	})
	return n
}
