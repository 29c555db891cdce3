package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
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
	if s.replicas != nil {
		return s.acquireReplicated(ctx, w, w.TTL, except)
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
	r := s.replicas
	if r == nil {
		return 0, false, nil
	}
	owner, ok := LeaseOwner(id)
	if !ok || owner >= len(r.cfg.Peers) {
		return 0, false, nil // not a lease ID of this set: answered as unknown
	}
	if owner == r.cfg.Self {
		return owner, false, r.ready()
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
	cl := s.bearerClient(auth)
	if cl == nil {
		return "", Errorf(codes.Unauthorized, "a valid bearer token is required")
	}
	return cl.name, nil
}

// onOwner sends a request on lease id to its owner and reads the answer into v.
func (s *Server) onOwner(ctx context.Context, owner int, auth, method, path string, body any, want int, v any) error {
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	var h http.Header
	if auth != "" {
		h = http.Header{"Authorization": {auth}}
	}
	resp, err := s.replicas.call(context.WithoutCancel(ctx), owner, method, path, raw, h)
	if err != nil {
		s.replicas.markDown(owner, 2*time.Second)
		return Unavailable("replica %d, which owns the lease, did not answer", owner)
	}
	s.metrics.forwarded.Inc()
	return peerAnswer(resp, want, v)
}

func leasePath(id, op string) string { return "/v1/leases/" + url.PathEscape(id) + op }

// RenewLease extends lease id by d.
func (s *Server) RenewLease(ctx context.Context, auth, id string, d time.Duration) (*LeaseResponse, error) {
	owner, remote, err := s.remoteOwner(id)
	switch {
	case err != nil:
		return nil, err
	case remote:
		var out LeaseResponse
		if err := s.onOwner(ctx, owner, auth, http.MethodPost, leasePath(id, "/renew"),
			RenewRequest{TTLSeconds: int(d / time.Second)}, http.StatusOK, &out); err != nil {
			return nil, err
		}
		return &out, nil
	}
	client, err := s.authClient(auth)
	if err != nil {
		return nil, err
	}
	return s.renewOwned(client, id, d)
}

// renewOwned renews client's lease id, which this replica owns.
func (s *Server) renewOwned(client, id string, d time.Duration) (*LeaseResponse, error) {
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
		return s.onOwner(ctx, owner, auth, http.MethodDelete, leasePath(id, ""), nil, http.StatusNoContent, nil)
	}
	client, err := s.authClient(auth)
	if err != nil {
		return err
	}
	s.releaseOwned(client, id)
	return nil
}

// releaseOwned ends client's lease id, which this replica owns. Another client's lease is
// left alone, and nothing is copied: as for an unknown lease.
func (s *Server) releaseOwned(client, id string) {
	if !s.store.Release(client, id) {
		return
	}
	// A release no replica heard of only keeps the slot counted until the lease's
	// expiry: answered anyway, since the crawler has stopped using the proxy. Releasing
	// again copies the ended lease again.
	_ = s.replicateLease(id)
}

// ReportLease records a report on lease id (see reportOwned).
func (s *Server) ReportLease(ctx context.Context, auth, id, result, target string) error {
	owner, remote, err := s.remoteOwner(id)
	switch {
	case err != nil:
		return err
	case remote:
		return s.onOwner(ctx, owner, auth, http.MethodPost, leasePath(id, "/report"),
			ReportRequest{Result: result, Target: target}, http.StatusNoContent, nil)
	}
	client, err := s.authClient(auth)
	if err != nil {
		return err
	}
	return s.reportOwned(client, id, result, target)
}

// reportOwned records client's report on its lease id, which this replica owns: a
// cooldown of the lease's proxy for target (the lease's own when empty) here at once, and
// durably in the proxy's workflow through the report queue.
func (s *Server) reportOwned(client, id, result, target string) error {
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
	if s.clients == nil {
		return nil, true
	}
	return s.clients.lookup(token), false
}

// Loaded says the index has been read from Temporal in full (Store.Loaded).
func (s *Server) Loaded() bool { return s.store.Loaded() }

// Freed counts the changes to the store that can free a slot (Store.Freed).
func (s *Server) Freed() uint64 { return s.store.Freed() }
