package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Held is a lease kept for as long as a crawler needs a proxy: it renews the lease before
// it expires and, when the lease ends under it (its proxy was replaced by a new instance,
// turned unhealthy or left the fleet, or the lease expired or was forgotten), acquires a
// new one for the same request. With a Session the new lease is on the session's next
// proxy, so a crawler's session moves only when it must, and never silently: Lease and
// Changes say when it did.
//
// Its HTTPClient always sends through the proxy of the current lease. While there is none
// (between losing a lease and getting the next), requests through it fail at once with
// ErrNoLease rather than leave from an address the crawler did not lease.
type Held struct {
	c   *Client
	req AcquireRequest

	mu    sync.Mutex
	lease *Lease
	// changes gets every new lease (nil when one is lost), without blocking: a crawler that
	// does not read it loses nothing but the notices.
	changes   chan *Lease
	transport *http.Transport

	stop context.CancelFunc
	done chan struct{}
}

// ErrNoLease is what requests through a Held's HTTPClient fail with while it has no lease.
var ErrNoLease = errors.New("discovery: no lease held right now (acquiring a new one)")

// Hold acquires a lease for req, as Acquire does, and keeps one until Close. The first
// acquire's error is returned as it is (IsNoMatch, IsIndexLoading, …); after that Held
// retries on its own, waiting as the server's Retry-After says.
func (c *Client) Hold(ctx context.Context, req AcquireRequest) (*Held, error) {
	l, err := c.Acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	loop, stop := context.WithCancel(context.WithoutCancel(ctx))
	h := &Held{c: c, req: req, lease: l, changes: make(chan *Lease, 16), stop: stop, done: make(chan struct{})}
	h.transport = http.DefaultTransport.(*http.Transport).Clone()
	h.transport.Proxy = func(*http.Request) (*url.URL, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.lease == nil {
			return nil, ErrNoLease
		}
		if u := h.lease.ProxyURL(); u != nil {
			return u, nil
		}
		return nil, ErrNoLease
	}
	go h.run(loop)
	return h, nil
}

// Lease is the current lease, and false while there is none.
func (h *Held) Lease() (Lease, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lease == nil {
		return Lease{}, false
	}
	return *h.lease, true
}

// Changes tells of every change of lease: the new lease, or nil when the current one was
// lost and a new one is being acquired. Renewals of the same lease are not changes.
func (h *Held) Changes() <-chan *Lease { return h.changes }

// HTTPClient returns the client that sends through the current lease's proxy (see
// Lease.HTTPClient). It is the same client for the life of the Held; when the lease
// changes, idle connections to the old proxy are closed, so later requests leave from the
// new one. Connections already carrying a request finish on the old proxy.
func (h *Held) HTTPClient() *http.Client { return &http.Client{Transport: h.transport} }

// Report reports on the current lease (see Client.Report).
func (h *Held) Report(ctx context.Context, result, target string) error {
	l, ok := h.Lease()
	if !ok {
		return ErrNoLease
	}
	return h.c.Report(ctx, l.ID, result, target)
}

// Close stops renewing, releases the current lease and closes the idle connections to its
// proxy. The lease still takes reports for the server's cooldown window.
func (h *Held) Close(ctx context.Context) error {
	h.stop()
	<-h.done
	h.mu.Lock()
	l := h.lease
	h.lease = nil
	h.mu.Unlock()
	h.transport.CloseIdleConnections()
	if l == nil {
		return nil
	}
	return h.c.Release(ctx, l.ID)
}

// set makes l (nil for none) the current lease: idle connections to a proxy the lease no
// longer names are closed, and a change of lease is told on Changes (a renewal of the same
// lease is not one).
func (h *Held) set(l *Lease) {
	h.mu.Lock()
	old := h.lease
	h.lease = l
	h.mu.Unlock()
	if old != nil && (l == nil || old.ProxyURL().String() != l.ProxyURL().String()) {
		h.transport.CloseIdleConnections()
	}
	if old == nil && l == nil || old != nil && l != nil && old.ID == l.ID {
		return
	}
	select {
	case h.changes <- l:
	default:
	}
}

// run renews the lease at half its remaining time, and replaces it when it is gone.
func (h *Held) run(ctx context.Context) {
	defer close(h.done)
	backoff := time.Second
	next := time.Duration(-1) // when set, the next wait instead of the usual one
	for {
		l, ok := h.Lease()
		wait := backoff
		if ok {
			wait = max(time.Until(l.ExpiresAt)/2, 200*time.Millisecond)
		}
		if next >= 0 {
			wait, next = next, -1
		}
		if !sleep(ctx, wait) {
			return
		}
		if !ok {
			nl, err := h.c.Acquire(ctx, h.req)
			if err != nil {
				backoff = retryDelay(err, backoff)
				continue
			}
			backoff = time.Second
			h.set(nl)
			continue
		}
		nl, err := h.c.Renew(ctx, l.ID, h.req.TTL)
		switch {
		case err == nil:
			backoff = time.Second
			h.set(nl)
		case IsLeaseGone(err):
			// Replaced, unhealthy, removed, expired or forgotten: a new lease at once.
			h.set(nil)
			next = 0
		case ctx.Err() != nil:
			return
		default:
			// Discovery unreachable or failing: keep the lease while it lasts, retrying
			// sooner than its half-life.
			backoff = retryDelay(err, backoff)
			if time.Until(l.ExpiresAt) <= 0 {
				h.set(nil)
				continue
			}
			next = min(backoff, max(time.Until(l.ExpiresAt)/4, 100*time.Millisecond))
		}
	}
}

// retryDelay is how long to wait after err: the server's Retry-After when it gave one,
// otherwise the previous wait doubled, from 1 to 30 seconds.
func retryDelay(err error, prev time.Duration) time.Duration {
	var e *Error
	if errors.As(err, &e) && e.RetryAfterSeconds > 0 {
		return e.RetryAfter()
	}
	return min(max(2*prev, time.Second), 30*time.Second)
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// String shows the held lease with the password redacted.
func (h *Held) String() string {
	if l, ok := h.Lease(); ok {
		return "held " + l.String()
	}
	return fmt.Sprintf("held (no lease; acquiring for %v)", h.req.Selector)
}
