package discovery

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"slices"
	"time"
)

// leaseKey is a lease ID's 16 bytes: the maps key on them rather than on the hex text,
// which is twice as long. The first byte is the replica that granted the lease and owns it
// (see Replicas); the other 15 are random.
type leaseKey [16]byte

func newLeaseKey(owner byte) leaseKey {
	var k leaseKey
	_, _ = rand.Read(k[:])
	k[0] = owner
	return k
}

// LeaseOwner is the replica that owns the lease with this ID: the one that granted it and
// alone renews, releases and takes reports for it. ok is false for a text that is not a
// lease ID.
func LeaseOwner(id string) (replica int, ok bool) {
	k, ok := parseLeaseID(id)
	return int(k[0]), ok
}

func (k leaseKey) String() string { return hex.EncodeToString(k[:]) }

// parseLeaseID reads a lease ID; anything that is not one is simply not a known lease.
func parseLeaseID(id string) (leaseKey, bool) {
	var k leaseKey
	if len(id) != 2*len(k) {
		return k, false
	}
	if _, err := hex.Decode(k[:], []byte(id)); err != nil {
		return k, false
	}
	return k, true
}

// lease is the store's record of a lease, live or ended. An ended lease keeps only what a
// report needs: the proxy (a snapshot shared with the index), the target, the count of
// reports and its session (a report by session names it), until keepUntil.
type lease struct {
	key     leaseKey
	proxyID string
	// proxy is the proxy as granted or last renewed; the store never changes a *Proxy
	// once made, so many leases share one.
	proxy   *Proxy
	target  string
	session string
	// sessionAt is when the session last pointed at this lease (its grant or latest
	// renewal): copies carry it, so that a replica restored from them remembers the
	// session as its owner does, idle for as long.
	sessionAt time.Time
	// client is the name of the crawler identity that took the lease ("" when
	// authentication is off). The lease is that client's alone: to any other, renewals,
	// releases and reports answer as for a lease that does not exist (see heldBy).
	client  string
	expires time.Time
	// reports counts the cooldowns this lease has reported (MaxReportsPerLease).
	reports int
	// version counts the owner's changes to the lease (grant, renewals, end): replicas
	// keep the highest they are sent, in whatever order the copies arrive.
	version uint64
	// Set once the lease has ended: until when it still takes reports, and, if it ended
	// because its proxy could no longer serve it, why (a ProxyGone reason).
	keepUntil time.Time
	gone      string
}

// heldBy reports whether client may act on the lease: only the client that took it. The
// names must be equal, "" included: a lease taken without authentication is anyone's
// while authentication is off, and nobody's once it is on (no client is named ""), which
// is also where a copy from a replica too old to send the client lands: it expires
// unrenewed rather than becoming everyone's.
func (l *lease) heldBy(client string) bool { return l.client == client }

func (l *lease) export() *Lease {
	return &Lease{ID: l.key.String(), ProxyID: l.proxyID, Target: l.target, Session: l.session, ExpiresAt: l.expires, Proxy: *l.proxy}
}

// session is where a sticky session lives now, and its latest lease: a report on the
// session (the gateway's crawlers cannot name a lease) is a report on that lease.
type session struct {
	proxyID  string
	lease    leaseKey
	lastUsed time.Time
}

// Want is what a crawler asks a lease for.
type Want struct {
	Selector Selector
	// Target is the site the crawler will visit: proxies resting for it are skipped.
	Target string
	// Session, if set, keeps the crawler on one proxy across leases (see Store.Lease).
	// Sessions are the client's own: two clients' sessions of one name are two sessions.
	Session string
	TTL     time.Duration
	// Client names the crawler identity asking; MaxLeases, when positive, is how many
	// live leases it may hold at once (more is a *LeaseLimit).
	Client    string
	MaxLeases int
}

// sessionRE is what a session name may be: enough for a UUID or a crawler's own key, and
// nothing that could not travel in a proxy username or a log line as it is.
var sessionRE = regexp.MustCompile(`^[A-Za-z0-9._~:-]{1,128}$`)

// ValidSession says whether name may name a sticky session, through the API or in the
// gateway's proxy username alike.
func ValidSession(name string) bool { return sessionRE.MatchString(name) }

// sessionKey is where the session table and the ring place a client's session.
func sessionKey(client, session string) string {
	if client == "" {
		return session
	}
	return client + "\x00" + session
}

// LeaseLimit refuses a lease to a client that holds as many as it may.
type LeaseLimit struct {
	Client string
	Max    int
	// RetryAfter is when the client's first lease expires.
	RetryAfter time.Duration
}

func (e *LeaseLimit) Error() string { return "client " + e.Client + " holds as many leases as it may" }

// clientLimit is a *LeaseLimit when w's client holds its MaxLeases already, else nil.
func (s *Store) clientLimit(w Want, now time.Time) error {
	if w.MaxLeases <= 0 || s.byClient[w.Client] < w.MaxLeases {
		return nil
	}
	// Only refusals pay for this scan of the live leases.
	var first time.Time
	for _, l := range s.leases {
		if l.client == w.Client && (first.IsZero() || l.expires.Before(first)) {
			first = l.expires
		}
	}
	return &LeaseLimit{Client: w.Client, Max: w.MaxLeases, RetryAfter: max(first.Sub(now), time.Second)}
}

// addLive puts a lease in the live table, counted for its client.
func (s *Store) addLive(l *lease) {
	s.leases[l.key] = l
	s.byClient[l.client]++
}

// --- cooldowns -----------------------------------------------------------------------

// coolingUntil is when e stops resting for target (local cooldowns from reports and
// durable ones from its workflow, for the target and for every target), or zero if it is
// not resting.
func (s *Store) coolingUntil(e *entry, target string, now time.Time) time.Time {
	var end time.Time
	consider := func(t time.Time) {
		if t.After(now) && t.After(end) {
			end = t
		}
	}
	consider(s.cooldowns.until(e.id, ""))
	consider(e.p.Cooldowns[""])
	if target != "" {
		consider(s.cooldowns.until(e.id, target))
		consider(e.p.Cooldowns[target])
	}
	return end
}

func (s *Store) cooling(e *entry, target string, now time.Time) bool {
	return !s.coolingUntil(e, target, now).IsZero()
}

// Cooldown puts a proxy in cooldown for target ("" = every target) until the given time.
func (s *Store) Cooldown(proxyID, target string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cooldowns.set(proxyID, target, until)
}

// --- leases --------------------------------------------------------------------------

// Acquire leases a proxy matching sel that is not cooling down for target (Lease without
// a session).
func (s *Store) Acquire(sel Selector, target string, ttl time.Duration) (*Lease, error) {
	return s.Lease(Want{Selector: sel, Target: target, TTL: ttl})
}

// Lease grants a lease on a proxy that matches w.Selector, is healthy, has a free slot and
// is not resting for w.Target.
//
// Without a session it spreads the load: the proxy with the fewest leases, and among
// those the one leased longest ago, so consecutive leases walk the whole fleet instead of
// wearing out the fastest proxy. With a session it keeps the crawler on the proxy the
// session last had while that proxy can take the lease; otherwise (or for a new session)
// it takes the first proxy that can, clockwise from the session's place on a hash ring of
// proxy IDs. The ring is the same in every process, so a session lands on the same proxy
// on any replica and after restarts, and a proxy joining or leaving moves only the
// sessions next to it.
func (s *Store) Lease(w Want) (*Lease, error) { return s.leaseExcept(w, nil) }

// leaseExcept is Lease passing over the proxies skip names (when not nil): the gateway's
// retry after a proxy refused a tunnel must not land on that proxy again.
func (s *Store) leaseExcept(w Want, skip func(proxyID string) bool) (*Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if err := s.clientLimit(w, now); err != nil {
		return nil, err
	}
	v := s.viewFor(w.Selector)
	pick := s.pickLocked(v, w, now, skip)
	if pick == nil {
		return nil, s.noMatch(v, w.Selector, w.Target, now)
	}
	return s.grantLocked(pick, w, now).export(), nil
}

// pick chooses the proxy Lease would grant w on, without granting it, passing over the
// proxies skip names. Replicas use it: the proxy's owner grants (Grant), and skip leaves
// out the proxies of owners that cannot answer now or that just refused.
func (s *Store) pick(w Want, skip func(proxyID string) bool) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if err := s.clientLimit(w, now); err != nil {
		return "", err
	}
	v := s.viewFor(w.Selector)
	pick := s.pickLocked(v, w, now, skip)
	if pick == nil {
		return "", s.noMatch(v, w.Selector, w.Target, now)
	}
	return pick.id, nil
}

// explain says why w finds no proxy now, as Lease's 409 would; it is for a caller that
// picked (pick) and lost every proxy it picked to other crawlers.
func (s *Store) explain(w Want) *NoMatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.noMatch(s.viewFor(w.Selector), w.Selector, w.Target, s.now())
}

// Grant leases the named proxy for w if it can take the lease now: it matches the
// selector, is healthy, has a free slot and is not resting for the target. Otherwise it
// fails with ErrProxyUnavailable, and the caller picks again. Only the proxy's owner calls
// it, so that one process counts the proxy's slots.
func (s *Store) Grant(proxyID string, w Want) (*Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if err := s.clientLimit(w, now); err != nil {
		return nil, err
	}
	e := s.proxies[proxyID]
	if e == nil || !e.inTrees || !w.Selector.Matches(e.p.Attributes) || s.cooling(e, w.Target, now) {
		return nil, ErrProxyUnavailable
	}
	return s.grantLocked(e, w, now).export(), nil
}

// pickLocked is the proxy Lease chooses (see there), or nil.
func (s *Store) pickLocked(v *view, w Want, now time.Time, skip func(string) bool) *entry {
	s.picks.Add(1)
	var pick *entry
	take := func(e *entry) bool {
		if s.cooling(e, w.Target, now) || (skip != nil && skip(e.id)) {
			return true
		}
		pick = e
		return false
	}
	if w.Session != "" {
		key := sessionKey(w.Client, w.Session)
		if it, ok := s.sessions.get(key); ok && now.Sub(it.val.lastUsed) < s.cfg.SessionIdle {
			if e := s.proxies[it.val.proxyID]; e != nil && e.inTrees && w.Selector.Matches(e.p.Attributes) {
				take(e)
			}
		}
		if pick == nil {
			pivot := &entry{ring: ringHash(key)}
			v.ring.AscendGreaterOrEqual(pivot, take)
			if pick == nil {
				v.ring.AscendLessThan(pivot, take)
			}
		}
	} else {
		v.tree.Ascend(take)
	}
	return pick
}

func (s *Store) grantLocked(pick *entry, w Want, now time.Time) *lease {
	s.grants++
	l := &lease{key: newLeaseKey(s.cfg.Replica), proxyID: pick.id, proxy: pick.p, target: w.Target, session: w.Session,
		client: w.Client, expires: now.Add(w.TTL), version: 1}
	s.changeLeases(pick, func() {
		pick.held = append(pick.held, l)
		pick.lastUsed = s.grants
	})
	s.addLive(l)
	if w.Session != "" {
		s.touchSession(sessionKey(w.Client, w.Session), l, now)
	}
	return l
}

// touchSession records that the session name was last served by lease l.
func (s *Store) touchSession(name string, l *lease, now time.Time) {
	l.sessionAt = now
	s.sessions.put(name, session{proxyID: l.proxyID, lease: l.key, lastUsed: now})
	for s.sessions.len() > s.cfg.MaxSessions {
		s.sessions.remove(s.sessions.oldest())
	}
}

// noMatch explains an acquire that found nothing, and says when to retry: the earliest
// time a matching healthy proxy frees a slot (a lease on it expires) or stops resting for
// the target. Only failed acquires pay for this scan of the matching proxies.
func (s *Store) noMatch(v *view, sel Selector, target string, now time.Time) *NoMatch {
	nm := &NoMatch{Considered: v.matching, Unhealthy: v.matching - v.healthy, AtCapacity: v.full,
		InCooldown: v.healthy - v.full}
	var soonest time.Time
	s.forMatching(sel, func(e *entry) {
		if !e.p.Healthy {
			return
		}
		var free time.Time
		if e.leaseCount() >= e.p.MaxLeases {
			for _, l := range e.held {
				if free.IsZero() || l.expires.Before(free) {
					free = l.expires
				}
			}
		} else {
			free = s.coolingUntil(e, target, now)
		}
		if !free.IsZero() && (soonest.IsZero() || free.Before(soonest)) {
			soonest = free
		}
	})
	if !soonest.IsZero() {
		// A lease past its expiry that the sweeper has not ended yet frees its slot within
		// a sweep: never tell a crawler to retry at once.
		nm.RetryAfter = max(soonest.Sub(now), time.Second)
	}
	return nm
}

// Release ends client's lease id. Releasing an unknown or already ended lease is not an
// error, nor is releasing another client's, which changes nothing: to that client the
// lease does not exist. known is whether the lease, live or ended, is client's.
func (s *Store) Release(client, id string) (known bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key, ok := parseLeaseID(id)
	if !ok {
		return false
	}
	if l, ok := s.leases[key]; ok {
		if !l.heldBy(client) {
			return false
		}
		// A crawler often learns it was banned as it finishes: a report right after
		// release still counts, for the same window as after expiry.
		s.endLocked(l, s.now().Add(s.cfg.KeepEnded))
		return true
	}
	it, ok := s.ended.get(key)
	return ok && it.val.heldBy(client)
}

// endLocked ends a live lease, keeping it for reports until keepUntil.
func (s *Store) endLocked(l *lease, keepUntil time.Time) {
	s.markFreedLocked()
	delete(s.leases, l.key)
	if s.byClient[l.client]--; s.byClient[l.client] <= 0 {
		delete(s.byClient, l.client)
	}
	if e, ok := s.proxies[l.proxyID]; ok {
		if i := slices.Index(e.held, l); i >= 0 {
			s.changeLeases(e, func() {
				e.held = slices.Delete(e.held, i, i+1)
			})
		}
	}
	// The session stays: a report by session names an ended lease as well as a live one,
	// and the copies of the ended lease carry it to a replica that restarts.
	l.keepUntil = keepUntil
	if l.key[0] == s.cfg.Replica {
		// Only the owner changes a lease's version. A copy ended here (its expiry swept)
		// keeps the owner's version, so the owner's renewal made at that moment, which
		// carries the next one, still applies here, and a restarted owner restores the
		// lease as its last renewal left it.
		l.version++
	}
	s.ended.put(l.key, l)
	for s.ended.len() > s.cfg.MaxEnded {
		s.ended.remove(s.ended.oldest())
	}
}

func (s *Store) expireLocked(l *lease) {
	s.endLocked(l, l.expires.Add(s.cfg.KeepEnded))
}

// Renew extends client's live lease id to now+ttl, on the same proxy at the same address.
// If the proxy can no longer serve the lease (it was replaced by an instance with another
// address, turned unhealthy or left the fleet) the lease ends and the error is a
// *ProxyGone saying why: answering with another address would move the crawler's session
// to another IP without it noticing. Another client's lease, live or ended, is
// ErrUnknownLease, as a lease that never was.
func (s *Store) Renew(client, id string, ttl time.Duration) (*Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	key, ok := parseLeaseID(id)
	if !ok {
		return nil, ErrUnknownLease
	}
	l, ok := s.leases[key]
	if ok && !l.heldBy(client) {
		return nil, ErrUnknownLease
	}
	if !ok {
		if it, ended := s.ended.get(key); ended && it.val.heldBy(client) {
			if it.val.gone != "" {
				return nil, &ProxyGone{Reason: it.val.gone}
			}
			return nil, ErrLeaseExpired
		}
		return nil, ErrUnknownLease
	}
	if !l.expires.After(now) {
		s.expireLocked(l)
		return nil, ErrLeaseExpired
	}
	e := s.proxies[l.proxyID]
	switch {
	case e == nil:
		l.gone = ProxyGoneRemoved
	case !e.probeHealthy:
		l.gone = ProxyGoneUnhealthy
	case e.p.IP != l.proxy.IP || e.p.Port != l.proxy.Port || e.p.Instance != l.proxy.Instance:
		l.gone = ProxyGoneReplaced
	}
	if l.gone != "" {
		s.endLocked(l, now.Add(s.cfg.KeepEnded))
		return nil, &ProxyGone{Reason: l.gone}
	}
	l.expires = now.Add(ttl)
	l.version++
	if e.p.CredentialsUnresolved == "" {
		// The credentials the proxy takes now (an External proxy's Secret may have been
		// rotated). While they cannot be resolved the renewal repeats the last ones the
		// lease was given: an answer without them would surely fail, and a proxy whose
		// key was merely rotated out of discovery's keyring still takes them.
		l.proxy = e.p
	}
	if l.session != "" {
		s.touchSession(sessionKey(l.client, l.session), l, now)
	}
	return l.export(), nil
}

// find returns client's lease id, live or ended within its report window. Another
// client's is ErrUnknownLease, and left as it is.
func (s *Store) find(client, id string, now time.Time) (*lease, error) {
	key, ok := parseLeaseID(id)
	if !ok {
		return nil, ErrUnknownLease
	}
	if l, ok := s.leases[key]; ok {
		if !l.heldBy(client) {
			return nil, ErrUnknownLease
		}
		if l.expires.After(now) {
			return l, nil
		}
		// Expired but not swept yet: the report window counts from its expiry.
		s.expireLocked(l)
	}
	if it, ok := s.ended.get(key); ok && it.val.heldBy(client) && it.val.keepUntil.After(now) {
		return it.val, nil
	}
	return nil, ErrUnknownLease
}

// Lookup returns client's lease id, live or ended within the report window.
func (s *Store) Lookup(client, id string) (*Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.find(client, id, s.now())
	if err != nil {
		return nil, err
	}
	return l.export(), nil
}

// Report records client's report on its lease id, live or ended within the report window
// (another client's is ErrUnknownLease). With a zero until (a success) it only checks the
// lease. Otherwise it rests the lease's proxy for target (the lease's own target when
// empty) until then, counting the report against the lease's cap (ErrReportLimit past
// it). It returns the lease and the target the report is for.
func (s *Store) Report(client, id, target string, until time.Time) (*Lease, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.find(client, id, s.now())
	if err != nil {
		return nil, "", err
	}
	if target == "" {
		target = l.target
	}
	if !until.IsZero() {
		if l.reports >= s.cfg.MaxReportsPerLease {
			return nil, "", ErrReportLimit
		}
		l.reports++
		if l.key[0] == s.cfg.Replica {
			l.version++ // a change of the owner's: its copies carry the count (see Apply)
		}
		s.cooldowns.set(l.proxyID, target, until)
	}
	return l.export(), target, nil
}

// SessionLease is the ID of the latest lease of a client's session, live or ended, while
// the session is remembered (until it has been idle for StoreConfig.SessionIdle).
func (s *Store) SessionLease(client, name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	it, ok := s.sessions.get(sessionKey(client, name))
	if !ok || s.now().Sub(it.val.lastUsed) >= s.cfg.SessionIdle {
		return "", false
	}
	return it.val.lease.String(), true
}

// RunSweeper calls Sweep every interval until ctx ends.
func (s *Store) RunSweeper(ctx context.Context, interval time.Duration) {
	every(ctx, interval, s.Sweep)
}

// every calls fn each interval until ctx ends (first after one interval).
func every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// Sweep ends expired leases and forgets ended leases, cooldowns and sessions past their
// time. Correctness does not depend on it running often: renewals check expiry
// themselves, and a lease counted a second too long only makes selection a little
// conservative. Apart from live leases (bounded by the fleet's capacity) it walks only
// what it removes, oldest first.
func (s *Store) Sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, l := range s.leases {
		if !l.expires.After(now) {
			s.expireLocked(l)
		}
	}
	for it := s.ended.oldest(); it != nil && !it.val.keepUntil.After(now); it = s.ended.oldest() {
		s.ended.remove(it)
	}
	s.cooldowns.sweep(now)
	for it := s.sessions.oldest(); it != nil && now.Sub(it.val.lastUsed) >= s.cfg.SessionIdle; it = s.sessions.oldest() {
		s.sessions.remove(it)
	}
}
