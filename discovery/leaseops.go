package discovery

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/discovery/codes"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// The operations on leases that the API's handlers and the gateway share. Each works on
// this replica's store when it owns the lease (or runs alone) and otherwise asks the
// owner, so that one process counts every slot of a proxy whichever door a crawler came
// in by. auth is the crawler's Authorization header, sent along to the owner, which
// authenticates the crawler itself ("" when authentication is off).
//
// A lease is the client's that took it. Renewing, releasing or reporting on it as any
// other client answers exactly as for a lease that does not exist (404 unknown_lease; a
// release 204 and no change): the owner decides, from the client its lease records, and
// the same check in the store serves both, so no other code path tells them apart.

// Grant leases a proxy for w, passing over the proxies except names (when not nil).
func (s *Server) Grant(ctx context.Context, w Want, except func(string) bool) (*LeaseResponse, error) {
	resp, err := s.grant(ctx, w, except)
	if err == nil {
		// Served now: a refusal of its client's for the same proxies is demand no more.
		s.forgetRefusal(w)
	}
	return resp, err
}

func (s *Server) grant(ctx context.Context, w Want, except func(string) bool) (*LeaseResponse, error) {
	if s.peers != nil {
		return s.acquireReplicated(ctx, w, except)
	}
	l, err := s.store.leaseExcept(w, except)
	if err != nil {
		return nil, err
	}
	resp := leaseResponse(l, w.TTL)
	return &resp, nil
}

// remoteOwner is the replica that owns lease id when it is another one. For a lease of
// its own, a replica that cannot act on its leases yet answers with that error.
func (s *Server) remoteOwner(id string) (owner int, remote bool, err error) {
	p := s.peers
	if p == nil {
		return 0, false, nil
	}
	owner, ok := LeaseOwner(id)
	if !ok || owner >= p.Len() {
		return 0, false, nil // not a lease ID of this set: answered as unknown
	}
	if owner == p.Self() {
		return owner, false, p.Ready()
	}
	return owner, true, nil
}

// authClient is the name of the client auth authenticates, for an operation this replica
// answers itself: "" when authentication is off, and a 401 for a token no client has (any
// more: the gateway holds a crawler's credentials for as long as its request lasts), as
// the owner would answer it.
func (s *Server) authClient(auth string) (string, error) {
	if s.clients == nil {
		return "", nil
	}
	cl := s.BearerClient(auth)
	if cl == nil {
		return "", Errorf(codes.Unauthorized, "a valid bearer token is required")
	}
	return cl.name, nil
}

// RenewLease extends lease id by d.
func (s *Server) RenewLease(ctx context.Context, auth, id string, d time.Duration) (*LeaseResponse, error) {
	owner, remote, err := s.remoteOwner(id)
	switch {
	case err != nil:
		return nil, err
	case remote:
		return s.peers.Renew(ctx, owner, auth, id, d)
	}
	client, err := s.authClient(auth)
	if err != nil {
		return nil, err
	}
	return s.RenewOwned(client, id, d)
}

// RenewOwned renews client's lease id, which this replica owns (or it runs alone).
func (s *Server) RenewOwned(client, id string, d time.Duration) (*LeaseResponse, error) {
	l, err := s.store.Renew(client, id, d)
	if _, gone := errors.AsType[*ProxyGone](err); err == nil || gone {
		// A renewal, or the end of a lease whose proxy is gone, is copied to the
		// other replicas before the crawler hears of it.
		if rerr := s.replicateLease(id); rerr != nil && err == nil {
			err = rerr
		}
	}
	if err != nil {
		return nil, &opError{op: opRenew, leaseID: id, err: err}
	}
	resp := leaseResponse(l, d)
	return &resp, nil
}

// ReleaseLease ends lease id. Failing to reach its owner only keeps the slot counted until
// the lease expires.
func (s *Server) ReleaseLease(ctx context.Context, auth, id string) error {
	owner, remote, err := s.remoteOwner(id)
	switch {
	case err != nil:
		return err
	case remote:
		return s.peers.Release(ctx, owner, auth, id)
	}
	client, err := s.authClient(auth)
	if err != nil {
		return err
	}
	s.ReleaseOwned(client, id)
	return nil
}

// ReleaseOwned ends client's lease id, which this replica owns (or it runs alone).
// Another client's lease is left alone, and nothing is copied: as for an unknown lease.
func (s *Server) ReleaseOwned(client, id string) {
	if !s.store.Release(client, id) {
		return
	}
	// A release no replica heard of only keeps the slot counted until the lease's
	// expiry: answered anyway, since the crawler has stopped using the proxy. Releasing
	// again copies the ended lease again.
	_ = s.replicateLease(id)
}

// ReportLease records a report on lease id (see ReportOwned).
func (s *Server) ReportLease(ctx context.Context, auth, id, result, target string) error {
	owner, remote, err := s.remoteOwner(id)
	switch {
	case err != nil:
		return err
	case remote:
		return s.peers.Report(ctx, owner, auth, id, result, target)
	}
	client, err := s.authClient(auth)
	if err != nil {
		return err
	}
	return s.ReportOwned(client, id, result, target)
}

// ReportOwned records client's report on its lease id, which this replica owns (or it
// runs alone): a
// cooldown of the lease's proxy for target (the lease's own when empty) here at once, and
// durably in the proxy's workflow through the report queue.
func (s *Server) ReportOwned(client, id, result, target string) error {
	var window time.Duration
	switch result {
	case contract.ReportOK:
	case contract.ReportRateLimited:
		window = s.cfg.CooldownRateLimited
	case contract.ReportBanned:
		window = s.cfg.CooldownBanned
	default:
		return Errorf(codes.InvalidResult, "result must be ok, rate_limited or banned, got %q", result)
	}
	target, err := NormalizeTarget(target)
	if err != nil {
		return err
	}
	var until time.Time
	if window > 0 {
		until = s.store.Now().Add(window)
	}
	l, target, err := s.store.Report(client, id, target, until)
	if err != nil {
		return &opError{op: opReport, leaseID: id, err: err}
	}
	s.metrics.reports.WithLabelValues(result).Inc()
	if window > 0 {
		s.forward(l, contract.ReportSignal{Target: target, Result: result, Until: until.UTC()})
		// The peers' copies carry the count, so the lease's cap holds on an owner restored
		// from them. The report itself is already taken: a copy no peer took is logged,
		// not answered as a failure, which a crawler would retry and count twice.
		_ = s.replicateLease(id)
	}
	return nil
}

// ClientOf is the client whose token this is (nil if none); open says the server has no
// clients, and takes anyone.
func (s *Server) ClientOf(token string) (cl *Client, open bool) {
	if s.Open() {
		return nil, true
	}
	return s.clients.lookup(token), false
}

// Open says the server has no clients, and takes anyone: authentication is off.
func (s *Server) Open() bool { return s.clients == nil }

// Alone says the server runs without peers: every lease operation is answered from this
// process's memory, without waiting on another replica, so a caller may make it where it
// must not block (the gateway's event loop).
func (s *Server) Alone() bool { return s.peers == nil }

// Loaded says the index has been read from Temporal in full (Store.Loaded).
func (s *Server) Loaded() bool { return s.store.Loaded() }

// Freed counts the changes to the store that can free a slot (Store.Freed).
func (s *Server) Freed() uint64 { return s.store.Freed() }

// ListProxies lists the proxies sel selects, only the healthy or the unhealthy ones when
// healthy is not nil, as GET /v1/proxies shows them.
func (s *Server) ListProxies(sel Selector, healthy *bool) ProxyList {
	list := s.store.List(sel, healthy)
	out := ProxyList{Proxies: make([]ListedProxy, 0, len(list)), Count: len(list)}
	for _, p := range list {
		lp := ListedProxy{ProxyInfo: info(p.Proxy), Healthy: p.Healthy, Phase: p.Phase,
			ActiveLeases: p.ActiveLeases, MaxLeases: p.MaxLeases}
		for target, until := range p.Resting {
			if lp.Cooldowns == nil {
				lp.Cooldowns = map[string]time.Time{}
			}
			if target == "" {
				target = "*"
			}
			lp.Cooldowns[target] = until.UTC()
		}
		out.Proxies = append(out.Proxies, lp)
	}
	return out
}

// ReportSession records a report on the latest lease of client's session (see
// ReportLease; auth is the crawler's Authorization). It is how a crawler of the gateway,
// which never sees a lease ID inside a tunnel, tells discovery that the site banned the
// proxy it was on.
func (s *Server) ReportSession(ctx context.Context, auth, client, session, result, target string) error {
	if !ValidSession(session) {
		return Errorf(codes.Invalid, "session must be 1-128 letters, digits, '.', '_', '~', ':' or '-'")
	}
	unknown := Errorf(codes.UnknownSession, "no lease of session %q in the last %s", session, s.store.cfg.SessionIdle)
	id, ok := s.store.SessionLease(client, session)
	if !ok {
		return unknown
	}
	err := s.ReportLease(ctx, auth, id, result, target)
	if ae, _ := ErrorOf(err); err != nil && ae.Code == codes.UnknownLease {
		// Here (ErrUnknownLease) or at the owner (its answer): the lease is past its
		// report window, and the session with it.
		return unknown
	}
	return err
}

// BearerClient is the client whose token an Authorization header bears, or nil (also when
// authentication is off). The scheme name is case-insensitive (RFC 9110).
func (s *Server) BearerClient(auth string) *Client {
	scheme, token, _ := strings.Cut(auth, " ")
	if s.clients == nil || !strings.EqualFold(scheme, "Bearer") {
		return nil
	}
	return s.clients.lookup(token)
}

// Throttle holds a client to its requests per second, through the API or the gateway:
// nil when the request may go on, else the 429 to answer.
func (s *Server) Throttle(cl *Client) *APIError {
	if cl.limiter == nil {
		return nil
	}
	now := time.Now()
	r := cl.limiter.ReserveN(now, 1)
	d := r.DelayFrom(now)
	if d == 0 && r.OK() {
		return nil
	}
	r.CancelAt(now)
	s.metrics.throttled.WithLabelValues(cl.name, "requests").Inc()
	e := Errorf(codes.TooManyRequests, "client %q is over its limit of %g requests per second", cl.name, float64(cl.limiter.Limit()))
	e.RetryAfterSeconds = int(max(1, (d+time.Second-1)/time.Second))
	return e
}

// LeaseLimited counts an acquire refused because client holds as many leases as it may
// (the API's; the gateway counts its own).
func (s *Server) LeaseLimited(client string) {
	s.metrics.throttled.WithLabelValues(client, "leases").Inc()
}

// Config is the server's configuration, its defaults applied.
func (s *Server) Config() Config { return s.cfg }
