//go:build !linux

package gateway

import (
	"context"
	"net"

	"github.com/prometheus/client_golang/prometheus"
)

// copyCounting copies src to dst until src ends, counting bytes (see copyChunks).
func copyCounting(dst, src net.Conn, bytes prometheus.Counter) error {
	return copyChunks(dst, src, bytes)
}

// Listen listens for crawlers on addr, with Go's default TCP keepalive.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	return lc.Listen(ctx, "tcp", addr)
}
