// Package gateway is discovery's forward proxy: the whole fleet behind one HTTP_PROXY
// address (plain HTTP and CONNECT), for crawlers that cannot speak the lease API. It
// leases through the same operations as the API's handlers (the leaseOps it is given), so
// its crawlers count against maxLeases, client caps, cooldowns and sessions as the API's
// do; what is its own is the proxying: dialling fleet proxies, tunnels, retries, waiting
// for a slot and renewing the leases of long requests.
package gateway

import (
	"context"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/codes"
	"github.com/proxyfleet/proxyfleet/internal/httpserve"
)

// Leases the gateway holds for open tunnels and answers: renewed side by side, released
// when their exchange ends; and serving until the context ends.

func (g *Gateway) hold(id, auth string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.held[id]; !ok {
		g.metrics.leasesHeld.Inc()
	}
	g.held[id] = auth
}

// unhold stops renewing lease id, and says whether it was held.
func (g *Gateway) unhold(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.held[id]; !ok {
		return false
	}
	delete(g.held, id)
	g.metrics.leasesHeld.Dec()
	return true
}

// release ends a lease the gateway held; the store's change wakes a request waiting for a slot.
func (g *Gateway) release(auth, id string) {
	g.unhold(id)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.ops.ReleaseLease(ctx, auth, id); err != nil {
		g.log.Debug("lease not released; it frees up when it expires", "lease", id, "error", err)
	}
}

// renewHeld renews every lease held, so that a request or tunnel keeps its slot for as
// long as it lasts and not a moment longer than LeaseTTL after the gateway died. A lease
// that cannot be renewed any more (its proxy is gone) is dropped: the request or tunnel
// on it carries on, uncounted, while it works.
func (g *Gateway) renewHeld(ctx context.Context) {
	t := time.NewTicker(g.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.renewPass(ctx)
		}
	}
}

// renewConcurrency bounds the renewals of one pass in flight at once. A renewal may wait
// for a peer's copy or for the lease's owner (up to seconds when one is slow): one at a
// time, the leases at the end of a long pass expired under open tunnels.
const renewConcurrency = 32

// renewPass renews the leases held now, up to renewConcurrency at once, each bounded by
// the pass interval, so one slow owner or peer delays none of the others.
func (g *Gateway) renewPass(ctx context.Context) {
	g.mu.Lock()
	held := maps.Clone(g.held)
	g.mu.Unlock()
	sem := make(chan struct{}, renewConcurrency)
	var wg sync.WaitGroup
	for id, auth := range held {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(ctx, g.cfg.LeaseTTL/3)
			defer cancel()
			err := g.renewOne(rctx, auth, id)
			if err == nil {
				return
			}
			if ae, _ := discovery.ErrorOf(err); ae.Code == codes.ReplicasUnavailable || rctx.Err() != nil && ctx.Err() == nil {
				return // the owner will answer again; the lease has LeaseTTL/3*2 left
			}
			// A lease released since the pass began is not lost: its request ended.
			if g.unhold(id) {
				g.metrics.leasesLost.Inc()
			}
		})
	}
	wg.Wait()
}

// renewOne renews one held lease (a field only so tests can stand in a slow owner).
func (g *Gateway) renewOne(ctx context.Context, auth, id string) error {
	if g.renewHook != nil {
		return g.renewHook(ctx, auth, id)
	}
	_, err := g.ops.RenewLease(ctx, auth, id, g.cfg.LeaseTTL)
	return err
}

// headerTimeout bounds a crawler's request head (the server's ReadHeaderTimeout, and the
// event loop's): a crawler that sends nothing holds nothing.
const headerTimeout = 10 * time.Second

// loopCount is how many event loops a gateway runs by default: one per processor Go uses.
func loopCount() int { return runtime.GOMAXPROCS(0) }

// Serve runs the gateway on ln until ctx ends. Then it stops accepting, gives plain
// requests in flight up to 10s, closes the tunnels still open and releases their leases.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	renewed := make(chan struct{})
	go func() { g.renewHeld(ctx); close(renewed) }()
	go g.transport.keepPruning(ctx)
	// No read or write timeout: a plain answer may stream for as long as the site sends
	// it, and a tunnel lives past its handler. The header timeout bounds a silent client.
	hs := &http.Server{Handler: g, ReadHeaderTimeout: g.headerTimeout, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		ConnContext: handoffContext}
	// The event loops accept and serve CONNECT tunnels; the server gets the rest.
	served := ln
	loops, ok := g.startLoops(ln, g.cfg.Loops)
	if ok {
		served = loops.hand
		g.mu.Lock()
		g.loops = loops
		g.mu.Unlock()
		go func() {
			<-ctx.Done()
			loops.stop()
		}()
	}
	err, _ := httpserve.Until(ctx, hs, served)
	cancel()
	if ok {
		loops.stop()
		_ = loops.hand.Close()
	}
	g.mu.Lock()
	g.closed = true
	open := make([]*tunnel, 0, len(g.tunnels))
	for t := range g.tunnels {
		open = append(open, t)
	}
	switched := slices.Collect(maps.Keys(g.switched))
	g.mu.Unlock()
	// Each tunnel's splices end and release its lease; a switched connection releases its
	// lease as it closes (the server does not wait for either).
	for _, t := range open {
		t.close()
	}
	for _, c := range switched {
		_ = c.Close()
	}
	<-renewed
	return err
}
