package gateway

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// ServeConns is serveConns, for the package's external tests.
var ServeConns = serveConns

// serveConns accepts connections on a loopback port until the test ends, each handled by
// handle on a goroutine of its own (which closes it when handle returns), and returns
// the port's address.
func serveConns(t *testing.T, handle func(net.Conn)) *net.TCPAddr {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr)
}
