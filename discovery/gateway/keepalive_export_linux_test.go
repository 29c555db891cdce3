package gateway

import (
	"net"
	"syscall"
)

// UpstreamKeepAlive says, for each open tunnel, whether its fleet proxy's connection has
// TCP keepalive on.
func (g *Gateway) UpstreamKeepAlive() []bool {
	g.mu.Lock()
	defer g.mu.Unlock()
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
	return out
}
