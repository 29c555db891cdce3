package discovery

import (
	"context"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Signaler forwards reports to the proxies' workflows, which keep cooldowns durably
// (discovery/temporal signals them). A report reaches it through the server's queue, so a
// slow Temporal never slows a crawler.
type Signaler interface {
	Report(ctx context.Context, namespace, name string, sig contract.ReportSignal) error
}

type pendingReport struct {
	namespace, name string
	sig             contract.ReportSignal
	// key is the report's coalescing key (see coalescer).
	key string
}

// drainTimeout bounds how long a stopping discovery spends forwarding the reports still
// queued: a rollout must not lose them, nor hang on a Temporal that does not answer.
const drainTimeout = 10 * time.Second

// coalescer lets one signal per (proxy address, target, result) through while the
// cooldown it started is in force. Every report already cools the proxy down locally at
// once; the workflow only needs to hear of a cooldown once, and crawlers that report every
// failed request would otherwise send it hundreds of identical signals. The address is in
// the key because a replacement starts with no cooldowns: its reports must get through.
type coalescer struct {
	mu    sync.Mutex
	until map[string]time.Time
	// pruneAt is the size at which expired entries are next swept out, nextSweep the
	// earliest time they may be.
	pruneAt   int
	nextSweep time.Time
}

// maxCoalesced bounds the coalescer's memory; past it, reports are forwarded uncoalesced.
const maxCoalesced = 65_536

func coalesceKey(l *Lease, sig contract.ReportSignal) string {
	return l.ProxyID + "\x00" + net.JoinHostPort(l.Proxy.IP, strconv.Itoa(int(l.Proxy.Port))) + "\x00" + sig.Target + "\x00" + sig.Result
}

// admit reports whether a signal for key, starting a cooldown until until, must be sent.
func (c *coalescer) admit(key string, now, until time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.until == nil {
		c.until = map[string]time.Time{}
	}
	if t, ok := c.until[key]; ok && t.After(now) {
		return false
	}
	if len(c.until) >= c.pruneAt && !now.Before(c.nextSweep) {
		// At most one sweep a second: a map full of live cooldowns must not be swept on
		// every report.
		c.nextSweep = now.Add(time.Second)
		for k, t := range c.until {
			if !t.After(now) {
				delete(c.until, k)
			}
		}
		// Never beyond the cap, or a full map would stop being swept.
		c.pruneAt = min(max(1024, 2*len(c.until)), maxCoalesced)
	}
	if _, known := c.until[key]; known || len(c.until) < maxCoalesced {
		c.until[key] = until
	}
	return true
}

// forget lets the next report for key through: its signal was not delivered.
func (c *coalescer) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.until, key)
}

// forward queues sig for the workflow of l's proxy without waiting: a crawler's report
// must not wait for Temporal. A report whose cooldown the workflow already heard of is
// coalesced (counted, not sent). When the queue is full the report is dropped (and
// counted); the local cooldown the caller set still applies.
func (s *Server) forward(l *Lease, sig contract.ReportSignal) {
	key := coalesceKey(l, sig)
	if !s.coalesce.admit(key, s.store.Now(), sig.Until) {
		s.metrics.reportsCoalesced.Inc()
		return
	}
	select {
	case s.reports <- pendingReport{namespace: l.Proxy.Namespace, name: l.Proxy.Name, sig: sig, key: key}:
	default:
		s.coalesce.forget(key)
		s.metrics.reportSignalFailures.Inc()
		s.log.Warn("report queue full; the local cooldown applies but is not made durable", "proxy", l.ProxyID)
	}
}

// RunReports forwards queued reports to Temporal, retrying each a few times. When ctx ends
// it forwards what is still queued, within drainTimeout, and returns: stop it only after
// the API has stopped taking reports.
func (s *Server) RunReports(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			s.drainReports()
			return
		case r := <-s.reports:
			if !s.send(ctx, r, 5) && ctx.Err() != nil {
				// Stopped mid-retry: the report is forwarded with the rest.
				s.drainReports(r)
				return
			}
		}
	}
}

// drainReports forwards first and every queued report once, within drainTimeout.
func (s *Server) drainReports(first ...pendingReport) {
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	sent, left := 0, 0
	next := func() (pendingReport, bool) {
		if len(first) > 0 {
			r := first[0]
			first = first[1:]
			return r, true
		}
		select {
		case r := <-s.reports:
			return r, true
		default:
			return pendingReport{}, false
		}
	}
	for {
		r, ok := next()
		if !ok {
			if sent+left > 0 {
				s.log.Info("reports forwarded while stopping", "forwarded", sent, "lost", left)
			}
			return
		}
		switch {
		case ctx.Err() != nil:
			left++
			s.metrics.reportSignalFailures.Inc()
		case s.send(ctx, r, 1):
			sent++
		default:
			left++
		}
	}
}

// send signals one report, trying up to attempts times, and reports whether it got through.
func (s *Server) send(ctx context.Context, r pendingReport, attempts int) bool {
	var err error
	for attempt := range attempts {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = s.signal.Report(sctx, r.namespace, r.name, r.sig)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil || attempt == attempts-1 {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(1<<attempt) * 200 * time.Millisecond):
		}
	}
	s.coalesce.forget(r.key)
	if ctx.Err() != nil && attempts > 1 {
		return false // interrupted by shutdown, not failed: the drain sends it
	}
	s.metrics.reportSignalFailures.Inc()
	s.log.Warn("report not forwarded to the proxy's workflow; the local cooldown still applies",
		"proxy", r.namespace+"/"+r.name, "target", r.sig.Target, "error", err)
	return false
}
