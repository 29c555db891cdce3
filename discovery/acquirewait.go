package discovery

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

// Waiting acquires: POST /v1/leases with waitSeconds. An acquire that no proxy can take
// now (a 409) waits, up to the wait it asked for, until one can: a lease ends (released,
// expired, or ended on another replica, whose copy arrives here), or the index gains a
// proxy that could take it (a pool scaled to zero starting one), or a proxy turns healthy
// or takes more leases. Every such change moves the store's count of freeing changes
// (Store.Freed), and wakes the first waiter (waitQueue, first come first served), which
// hands the wake on to the next when the change is of no use to it. Each waiter also
// looks by itself at most every waitPoll, and only when that count moved or when the
// refusal's Retry-After came (a cooldown that ends is no change to the store): while
// nothing changes, a thousand waiting acquires cost the store nothing.
//
// The gateway's requests and tunnels wait in the same queue, through WaitForProxy, with
// their own rules (Waiting): they pass over the proxies they tried, and wait out only a
// full or resting fleet or their client's cap.

// DefaultMaxAcquireWait is the longest waitSeconds an acquire may ask for by default
// (cmd/discovery's --max-acquire-wait).
const DefaultMaxAcquireWait = time.Minute

// waitPoll is how often a waiting acquire looks for a proxy by itself: a wake comes at
// once for every change the store counts; this only bounds how late a waiter notices a
// change that freed more than one slot (one wake each), or a wake dropped because every
// waiter had one pending.
const waitPoll = 500 * time.Millisecond

// Wait is the wait a request's waitSeconds asks for: none for 0, a 400 invalid below 0
// or past cfg.MaxAcquireWait.
func (cfg Config) Wait(seconds int) (time.Duration, error) {
	switch {
	case seconds < 0:
		return 0, Errorf(codes.Invalid, "waitSeconds must not be negative")
	case int64(seconds) > int64(cfg.MaxAcquireWait/time.Second):
		return 0, Errorf(codes.Invalid, "waitSeconds %d exceeds the maximum of %d", seconds, int(cfg.MaxAcquireWait/time.Second))
	}
	return time.Duration(seconds) * time.Second, nil
}

// GrantWaiting is Grant (of any proxy), waiting up to wait when no proxy can take the
// lease now (see above). It answers the lease once one could be granted; the refusal (the
// 409, as Grant answers it, looked at again when the wait ends) when none could within
// wait; and, when the crawler left (ctx ended) meanwhile, an error nobody reads: nothing
// is held for it, a lease granted as it left is ended. Other refusals (the client's own
// cap, an owner that cannot answer) are answered at once, as without a wait.
func (s *Server) GrantWaiting(ctx context.Context, w Want, wait time.Duration) (*LeaseResponse, error) {
	freed := s.store.Freed()
	l, err := s.Grant(ctx, w, nil)
	if err == nil || wait <= 0 || !worthWaiting(err) || ctx.Err() != nil || s.stoppingWaits() {
		s.noteRefusal(w, err)
		return l, err
	}
	s.metrics.acquireWaiting.Inc()
	defer s.metrics.acquireWaiting.Dec()
	l, outcome, err := s.waitForSlot(ctx, w, wait, err, freed, Waiting{})
	s.metrics.acquireWaits.WithLabelValues(outcome).Inc()
	return l, err
}

// Waiting is how one request waits for a proxy, where it differs from an acquire's.
type Waiting struct {
	// Skip passes over proxies (by ID) the request will not take: those it tried.
	Skip func(proxyID string) bool
	// Worth says whether a refusal is worth waiting out (default: any 409).
	Worth func(error) bool
	// Poll bounds how long a waiter goes without looking by itself (default waitPoll).
	Poll time.Duration
}

func (how Waiting) worth(err error) bool {
	if how.Worth != nil {
		return how.Worth(err)
	}
	return worthWaiting(err)
}

// pollAfter is how long a waiter waits before it looks by itself: Poll, or less when the
// refusal said a proxy frees up sooner.
func (how Waiting) pollAfter(refusal error) time.Duration {
	d := cmp.Or(how.Poll, waitPoll)
	if nm := NoMatchOf(refusal); nm != nil && nm.RetryAfter > 0 {
		d = min(d, max(nm.RetryAfter, 5*time.Millisecond))
	}
	return d
}

// WaitForProxy waits up to wait, as an acquire with a wait does (see above), for a lease
// that Grant refused with refusal; freed is Store.Freed as it was before that grant. It
// answers the lease, the refusal when none came within wait or a refusal not worth waiting
// out came, or an error nobody reads when the crawler left (nothing held for it).
func (s *Server) WaitForProxy(ctx context.Context, w Want, wait time.Duration, refusal error, freed uint64, how Waiting) (*LeaseResponse, error) {
	l, _, err := s.waitForSlot(ctx, w, wait, refusal, freed, how)
	return l, err
}

// Outcomes of a waiting acquire, the label of proxyfleet_discovery_acquire_waits_total.
const (
	waitGranted  = "granted"  // a proxy took the lease within the wait
	waitTimedOut = "timeout"  // none could within the wait: the 409
	waitCanceled = "canceled" // the crawler left
	waitRefused  = "refused"  // another refusal ended the wait (the client's cap, an owner down)
	waitStopped  = "stopped"  // discovery is stopping: the 503 that says to retry
)

// StopWaiting ends every wait of an acquire, now and to come, with a 503 that says to
// retry (another replica, or this one restarted, takes the wait on): discovery is
// stopping, and would otherwise cut them off when it stops waiting for requests in
// flight, long before their waits end.
func (s *Server) StopWaiting() {
	s.stopWaits.Do(func() { close(s.waitsStopped) })
}

func (s *Server) stoppingWaits() bool {
	select {
	case <-s.waitsStopped:
		return true
	default:
		return false
	}
}

func (s *Server) waitForSlot(ctx context.Context, w Want, wait time.Duration, refusal error, freed uint64, how Waiting) (*LeaseResponse, string, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	poll := time.NewTimer(how.pollAfter(refusal))
	defer poll.Stop()
	me := s.waiters.Join(w.Selector)
	defer s.waiters.Leave(me)
	// Waiting now, and counted as such: a refusal of its client's is demand no more.
	s.forgetRefusal(w)
	// A change between the refusal and join woke nobody for this acquire: look again.
	again := s.store.Freed() != freed
	// The store's count at the last look, and when the refusal said a proxy frees up by
	// itself (a cooldown ending moves no count): a tick of poll before then that finds the
	// count unmoved looks at nothing.
	seen, due := freed, dueOf(refusal)
	for {
		woken, last := false, false
		if !again {
			select {
			case <-ctx.Done():
				return nil, waitCanceled, errCrawlerLeft()
			case <-s.waitsStopped:
				return nil, waitStopped, Unavailable("discovery is stopping: retry, and the wait goes on at another replica")
			case <-deadline.C:
				last = true // one more look, for today's 409 as of now
			case <-me.Turn():
				s.waiters.Took(me)
				woken = true
			case <-poll.C:
				if s.store.Freed() == seen && (due.IsZero() || time.Now().Before(due)) {
					poll.Reset(how.pollAfter(refusal))
					continue
				}
			}
		}
		again = false
		seen = s.store.Freed()
		s.waitChecks.Add(1)
		l, err := s.Grant(ctx, w, how.Skip)
		switch {
		case err == nil:
			if ctx.Err() != nil {
				s.abandon(ctx, w.Client, l)
				return nil, waitCanceled, errCrawlerLeft()
			}
			return l, waitGranted, nil
		case ctx.Err() != nil:
			return nil, waitCanceled, errCrawlerLeft()
		case !how.worth(err):
			return nil, waitRefused, err
		case last:
			s.noteRefusal(w, err)
			return nil, waitTimedOut, err
		}
		refusal = err
		if woken {
			s.waiters.Pass(me)
		}
		due = dueOf(refusal)
		poll.Reset(how.pollAfter(refusal))
	}
}

// abandon ends lease l, granted for client's crawler that left before it got it: nobody
// would hold it, and it would take its slot for its whole TTL (see handOver).
func (s *Server) abandon(ctx context.Context, client string, l *LeaseResponse) {
	if s.peers != nil {
		if owner, ok := LeaseOwner(l.LeaseID); ok && owner != s.peers.Self() {
			if err := s.peers.EndGrant(ctx, owner, client, l.LeaseID); err != nil {
				s.log.Info("a lease granted for a crawler that left was not ended: it frees up when it expires", "lease", l.LeaseID, "error", err)
			}
			return
		}
	}
	s.ReleaseOwned(client, l.LeaseID)
}

// worthWaiting says whether a refused acquire may be granted later by waiting: no proxy
// can take it now (409), whether some matching proxy is full or resting, or none matches
// yet (a pool scaled to zero starts one). The refusal may be this replica's or, in a
// replica set, the answer of a proxy's owner.
func worthWaiting(err error) bool { return NoMatchOf(err) != nil }

// NoMatchOf is the NoMatch a refusal carries: the store's own, or the one another replica
// answered with.
func NoMatchOf(err error) *NoMatch {
	if nm, ok := errors.AsType[*NoMatch](err); ok {
		return nm
	}
	if ae, ok := errors.AsType[*APIError](err); ok && ae.Code == codes.NoMatch {
		return ae.NoMatch
	}
	return nil
}

// dueOf is when the refusal said a proxy frees up by itself, or zero.
func dueOf(refusal error) time.Time {
	if nm := NoMatchOf(refusal); nm != nil && nm.RetryAfter > 0 {
		return time.Now().Add(nm.RetryAfter)
	}
	return time.Time{}
}

// WaitChecks counts the grants waiting acquires tried again: what waiting cost the store.
func (s *Server) WaitChecks() int64 { return s.waitChecks.Load() }

// Waiting is how many acquires wait for a proxy now.
func (s *Server) Waiting() int { return s.waiters.Len() }

// waitQueue is where requests that found no proxy to lease wait for one: the API's
// acquires with a wait and the gateway's requests and tunnels, all woken by the store's
// changes that can free a slot. A wake goes to the first waiter without one
// pending; a waiter the freed slot does not suit (it wants other proxies, or its site
// rests on that one) hands it on to the next (Pass). A freed slot so costs one attempt at
// a grant when the first waiter can take it, instead of every waiter scanning the fleet
// under the store's lock again and again while nothing changes. Slots that free up where
// no wake is called are found by each waiter's own slow fallback check.
//
// The zero value is ready to use.
type waitQueue struct {
	mu    sync.Mutex
	queue []*waiter
}

// waiter is one waiting request in a waitQueue.
type waiter struct {
	// turn carries a wake to the waiter; it holds at most one, since a waiter that has one
	// pending (signalled) is passed over.
	turn chan struct{}
	// signalled, under waitQueue.mu, says a wake is in turn and not taken yet.
	signalled bool
	// want is the selector the request waits for: its pool's demand (Server.Demand).
	want Selector
}

// Turn receives the waiter's wakes; call Took after receiving one.
func (w *waiter) Turn() <-chan struct{} { return w.turn }

// Join adds a waiter for a proxy matching want at the back of the queue.
func (q *waitQueue) Join(want Selector) *waiter {
	w := &waiter{turn: make(chan struct{}, 1), want: want}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queue = append(q.queue, w)
	return w
}

// Leave removes w. A wake it was given and did not take goes to the next waiter: the slot
// it stands for is still free for all w knows.
func (q *waitQueue) Leave(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := q.indexLocked(w)
	if i < 0 {
		return
	}
	q.queue = append(q.queue[:i], q.queue[i+1:]...)
	if w.signalled {
		w.signalled = false
		q.signalLocked(i)
	}
}

// Took records that w has taken the wake in its turn and is trying for the slot: a slot
// that frees up meanwhile wakes it again rather than passing it over.
func (q *waitQueue) Took(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.signalled = false
}

// Wake says a slot may have freed up: the first waiter without a pending wake gets one.
// It takes only the queue's lock (the store calls it under its own).
func (q *waitQueue) Wake() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.signalLocked(0)
}

// Pass hands the wake w took on to the waiters behind it: the slot did not suit w, and may
// suit one of them.
func (q *waitQueue) Pass(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if i := q.indexLocked(w); i >= 0 {
		q.signalLocked(i + 1)
	}
}

// Len is how many wait.
func (q *waitQueue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

// waitingFor counts the waiters a proxy with attributes attrs could serve.
func (q *waitQueue) waitingFor(attrs Selector) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, w := range q.queue {
		if w.want.Matches(attrs) {
			n++
		}
	}
	return n
}

// wants counts the waiters by the selector they want: what a metrics scrape matches every
// watched selector against, once the queue's lock (which the store's wakes take) is
// released. Crawlers ask for few distinct selectors, so this is small however many wait.
func (q *waitQueue) wants() map[string]*wantCount {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := map[string]*wantCount{}
	for _, w := range q.queue {
		key := w.want.Key()
		if c := out[key]; c != nil {
			c.n++
			continue
		}
		out[key] = &wantCount{want: w.want, n: 1}
	}
	return out
}

// wantCount is how many requests want one selector.
type wantCount struct {
	want Selector
	n    int
}

// servedBy sums the counts a proxy with attributes attrs could serve.
func servedBy(counts map[string]*wantCount, attrs Selector) int {
	n := 0
	for _, c := range counts {
		if c.want.Matches(attrs) {
			n += c.n
		}
	}
	return n
}

// signalLocked wakes the first waiter from index from on that has no wake pending. When
// every one has, the wake is dropped: each of them will look at the store anyway.
func (q *waitQueue) signalLocked(from int) {
	for _, w := range q.queue[min(from, len(q.queue)):] {
		if !w.signalled {
			w.signalled = true
			w.turn <- struct{}{}
			return
		}
	}
}

func (q *waitQueue) indexLocked(w *waiter) int {
	for i, x := range q.queue {
		if x == w {
			return i
		}
	}
	return -1
}
