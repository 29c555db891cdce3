//go:build !linux

package discovery

import (
	"context"
	"net"

	"github.com/prometheus/client_golang/prometheus"
)

// copyCounting copies src to dst until src ends, counting bytes (see copyChunks).
func copyCounting(dst, src net.Conn, bytes prometheus.Counter) error {
	return copyChunks(dst, src, bytes)
}

// ListenGateway listens for crawlers on addr, with Go's default TCP keepalive.
func ListenGateway(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	return lc.Listen(ctx, "tcp", addr)
}
