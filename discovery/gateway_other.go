//go:build !linux

package discovery

import (
	"net"

	"github.com/prometheus/client_golang/prometheus"
)

// copyCounting copies src to dst until src ends, counting bytes (see copyChunks).
func copyCounting(dst, src net.Conn, bytes prometheus.Counter) error {
	return copyChunks(dst, src, bytes)
}
