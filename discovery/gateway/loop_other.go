//go:build !linux

package gateway

import "net"

// loopSet stands for the event loops, which only Linux has: elsewhere a goroutine serves
// each connection.
type loopSet struct{ hand net.Listener }

func (g *Gateway) startLoops(net.Listener, int) (*loopSet, bool) { return nil, false }

func (s *loopSet) stop() {}
