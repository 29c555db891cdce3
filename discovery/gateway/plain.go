// Package gateway is discovery's forward proxy: the whole fleet behind one HTTP_PROXY
// address (plain HTTP and CONNECT), for crawlers that cannot speak the lease API. It
// leases through the same operations as the API's handlers (the leaseOps it is given), so
// its crawlers count against maxLeases, client caps, cooldowns and sessions as the API's
// do; what is its own is the proxying: dialling fleet proxies, tunnels, retries, waiting
// for a slot and renewing the leases of long requests.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

// Plain HTTP requests: forwarded by a reverse proxy whose transport leases a fleet proxy
// per request, releases it on every way the answer can end, and reports bans.

// gatewayRoundTripper carries a plain request through a leased fleet proxy, trying
// another when one fails before the request could have reached the site.
type gatewayRoundTripper struct{ g *Gateway }

// noLease is a round trip that found no (further) proxy to lease.
type noLease struct{ err error }

func (e noLease) Error() string { return e.err.Error() }

var errUpstream = errors.New("every fleet proxy tried failed")

func (rt gatewayRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	g := rt.g
	x, _ := req.Context().Value(exchangeKey{}).(*exchange)
	if x == nil {
		return nil, errors.New("gateway: a request without its exchange")
	}
	// A request can go to another proxy if none of it was sent, which the transport can
	// tell only for a failed connection, or if sending it twice is harmless; either way
	// its body is gone once sent.
	resendable := req.Body == nil || req.Body == http.NoBody
	idempotent := resendable && (req.Method == http.MethodGet || req.Method == http.MethodHead ||
		req.Method == http.MethodOptions || req.Method == http.MethodTrace)
	for len(x.tried) < g.cfg.Attempts {
		l, err := g.leaseFor(req.Context(), x)
		if err != nil {
			return nil, noLease{err}
		}
		id := l.Proxy.ID()
		pu, err := url.Parse(l.Proxy.URL)
		if err != nil {
			g.release(x.auth, l.LeaseID)
			return nil, err
		}
		resp, err := g.transport.RoundTrip(req.WithContext(context.WithValue(req.Context(), fleetProxyKey{}, pu)))
		var f *upstreamFailure
		switch {
		case err != nil && req.Context().Err() != nil:
			g.release(x.auth, l.LeaseID)
			return nil, req.Context().Err()
		case err != nil:
			if oe, ok := errors.AsType[*net.OpError](err); ok && oe.Op == "proxyconnect" {
				f = dialFailure(id, err, resendable)
			} else {
				f = ioFailure(id, err)
				f.retry = idempotent
			}
		case resp.StatusCode == http.StatusProxyAuthRequired && resp.Header.Get("Proxy-Authenticate") != "":
			// The fleet proxy refused its credentials, before anything reached the site: any
			// request without a body can go to another proxy. (A site's 407 carries no
			// challenge by the time it gets here, see proxysOwn, and is the site's answer:
			// sending the request again would repeat whatever it did there.)
			resp.Body.Close()
			f = &upstreamFailure{proxy: id, kind: failAuth, detail: "refused its credentials (407)", retry: resendable}
		case resp.StatusCode/100 == 4 && proxysOwn(resp):
			// The fleet proxy refused the request itself (a destination or port its rules
			// deny): another proxy of the fleet applies the same rules, and the site never
			// saw the request, so it is neither tried again nor a report on the proxy.
			resp.Body.Close()
			f = &upstreamFailure{proxy: id, kind: failRefused, detail: "refused the request itself (" + resp.Status + ")"}
		}
		if f != nil {
			g.failed(x, *f)
			g.release(x.auth, l.LeaseID)
			if !f.retry {
				break
			}
			continue
		}
		if result, ok := g.report[resp.StatusCode]; ok && !proxysOwn(resp) {
			// Only the site's own refusals are reports: the fleet proxy's (a 5xx it gives
			// when it cannot reach the site) say nothing of how the site treats it.
			g.reportStatus(req.Context(), x, l, result)
		}
		x.span.SetAttributes(attribute.String("proxyfleet.proxy", id), attribute.Int("http.response.status_code", resp.StatusCode))
		if resp.StatusCode == http.StatusSwitchingProtocols {
			if err := switchAsked(req.Header, resp.Header); err != nil {
				// The reverse proxy refuses such an answer without closing it, which would
				// hold the lease (and the connection) for as long as the gateway runs: a
				// site could pin every slot of the fleet with one URL.
				resp.Body.Close()
				g.release(x.auth, l.LeaseID)
				g.failed(x, upstreamFailure{proxy: id, kind: failSwitched, detail: err.Error()})
				return nil, err
			}
		}
		done := func() { g.release(x.auth, l.LeaseID) }
		if rwc, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
			lc := &leaseConn{ReadWriteCloser: rwc, g: g}
			lc.done = func() {
				g.untrackSwitched(lc)
				done()
			}
			if !g.trackSwitched(lc) {
				rwc.Close()
				g.release(x.auth, l.LeaseID)
				return nil, discovery.Errorf(codes.ReplicasUnavailable, "the gateway stopped while the site answered")
			}
			resp.Body = lc
		} else {
			resp.Body = &leaseBody{ReadCloser: resp.Body, done: done, silence: g.cfg.ResponseHeaderTimeout, flush: x.flusher}
		}
		x.body = resp.Body
		return resp, nil
	}
	return nil, errUpstream
}

// proxysOwn says whether a plain answer is the fleet proxy's own rather than the site's,
// from what only a fleet proxy's own answers carry:
//
//   - a 407 with a challenge (Proxy-Authenticate). A proxy must send one with its 407
//     (RFC 9110, 11.7.1), and the fleet's proxies remove a site's before passing its
//     answer on (the local proxy as a hop-by-hop header, Squid unless a cache_peer passes
//     logins through), so a site cannot make its 407 look like the proxy's and have a
//     request sent again.
//   - an X-Squid-Error header: Squid names the error page it made itself there (its
//     denials, ERR_ACCESS_DENIED for a destination its rules deny, and its failures to
//     reach the site). A site behind a Squid of its own can send one too; its refusal then
//     goes unreported, which costs less than resting a proxy the site never refused.
//
// The realm of a challenge is no marker: a site can name any realm, and a fleet proxy's
// is configuration.
func proxysOwn(resp *http.Response) bool {
	if resp.StatusCode == http.StatusProxyAuthRequired {
		return resp.Header.Get("Proxy-Authenticate") != ""
	}
	return resp.Header.Get("X-Squid-Error") != ""
}

// switchAsked reports why a 101 answer may not be passed on: the crawler did not ask to
// switch protocols, or asked for another one than the site switched to (what the reverse
// proxy checks too, but without ending the answer).
func switchAsked(req, resp http.Header) error {
	asked, got := upgradeOf(req), upgradeOf(resp)
	switch {
	case asked == "":
		return fmt.Errorf("the site switched protocols (to %q) though the request did not ask to", got)
	case !strings.EqualFold(asked, got):
		return fmt.Errorf("the site switched protocols to %q when %q was asked", got, asked)
	}
	return nil
}

// upgradeOf is the protocol a header asks or answers to switch to: its Upgrade, if its
// Connection names it; "" otherwise. Non-printable values count as none.
func upgradeOf(h http.Header) string {
	named := false
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			named = named || strings.EqualFold(strings.TrimSpace(tok), "upgrade")
		}
	}
	if !named {
		return ""
	}
	up := h.Get("Upgrade")
	for _, c := range up {
		if c < ' ' || c > '~' {
			return ""
		}
	}
	return up
}

// reportStatus reports the proxy for the request's target on a status that says the
// site refused it.
func (g *Gateway) reportStatus(ctx context.Context, x *exchange, l *discovery.LeaseResponse, result string) {
	g.metrics.reports.WithLabelValues(result).Inc()
	if err := g.ops.ReportLease(ctx, x.auth, l.LeaseID, result, ""); err != nil {
		g.log.Warn("report from an answer's status not recorded", "proxy", l.Proxy.Namespace+"/"+l.Proxy.Name,
			"result", result, "error", err)
	}
}

// copyBuffers lends the reverse proxy its 32 KiB copy buffers: allocated per answer,
// they were most of the gateway's garbage.
type copyBuffers struct{}

var responseBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (copyBuffers) Get() []byte  { return *responseBuffers.Get().(*[]byte) }
func (copyBuffers) Put(b []byte) { responseBuffers.Put(&b) }

// leaseBody releases a plain request's lease once its answer has been read or dropped.
//
// A read that waits longer than silence for the site's next bytes ends the answer (a
// site that stalls mid-answer would otherwise keep the lease for as long as it likes, the
// crawler's hang-up unseen when it has sent anything after its request): only time spent
// waiting on the site counts, not a crawler's slow reading.
type leaseBody struct {
	io.ReadCloser
	once    sync.Once
	done    func()
	silence time.Duration
	timer   *time.Timer
	// flush sends on what the crawler's connection holds of the answer; passed says bytes
	// were read (and so written to the crawler) since the last flush.
	flush  http.Flusher
	passed bool
}

func (b *leaseBody) Read(p []byte) (int, error) {
	if b.passed && b.flush != nil {
		// This read may wait on the site: what it sent so far goes to the crawler first,
		// instead of waiting in the server's buffer for more (the reverse proxy flushes an
		// answer of known length only at its end, and a site that pauses mid-answer would
		// keep its last bytes from the crawler until the silence timeout cut it). Pieces
		// as large as the buffer go out as they are written, and flushing nothing costs
		// nothing; an answer read whole in one read is never flushed here.
		b.flush.Flush()
		b.passed = false
	}
	n, err := b.read(p)
	b.passed = n > 0
	return n, err
}

// read reads the answer, closing it after silence without a byte.
func (b *leaseBody) read(p []byte) (int, error) {
	if b.silence <= 0 {
		return b.ReadCloser.Read(p)
	}
	if b.timer == nil {
		b.timer = time.AfterFunc(b.silence, func() { _ = b.Close() })
	} else {
		b.timer.Reset(b.silence)
	}
	n, err := b.ReadCloser.Read(p)
	b.timer.Stop()
	return n, err
}

func (b *leaseBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.done)
	return err
}

// leaseConn is leaseBody for an upgraded connection (a WebSocket over plain HTTP), which
// the reverse proxy needs to write to as well. The reverse proxy ends it as soon as the
// crawler's side ends (it has no CloseWrite); once the site's side has ended, the crawler
// has HalfClosedTimeout of silence to finish or close.
type leaseConn struct {
	io.ReadWriteCloser
	g      *Gateway
	once   sync.Once
	done   func()
	closed atomic.Bool
	ended  atomic.Bool
	// moved counts the bytes the crawler sent, for closeWhenIdle, and idle is its timer.
	moved atomic.Int64
	idle  atomic.Pointer[time.Timer]
}

func (b *leaseConn) Read(p []byte) (int, error) {
	n, err := b.ReadWriteCloser.Read(p)
	if err == io.EOF && !b.ended.Swap(true) {
		b.g.closeWhenIdle(&b.idle, &b.moved, b.closed.Load, func() { _ = b.Close() })
	}
	return n, err
}

func (b *leaseConn) Write(p []byte) (int, error) {
	n, err := b.ReadWriteCloser.Write(p)
	b.moved.Add(int64(n))
	return n, err
}

func (b *leaseConn) Close() error {
	b.closed.Store(true)
	stopIdle(&b.idle)
	err := b.ReadWriteCloser.Close()
	b.once.Do(b.done)
	return err
}

// forwardFailed answers a plain request that no fleet proxy carried.
func (g *Gateway) forwardFailed(w http.ResponseWriter, r *http.Request, err error) {
	x, _ := r.Context().Value(exchangeKey{}).(*exchange)
	if x == nil {
		g.fail(w, err)
		return
	}
	if r.Context().Err() != nil {
		// The crawler went away (while its request waited for a slot, say): nobody
		// reads an answer.
		x.result = "canceled"
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	if nl, ok := errors.AsType[noLease](err); ok {
		x.result = g.failNoLease(w, x, nl.err)
		return
	}
	if len(x.failures) > 0 {
		x.result = g.fail(w, x.upstreamError())
		return
	}
	x.result = g.fail(w, err)
}
