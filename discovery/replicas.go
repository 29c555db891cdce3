package discovery

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

// ReplicaConfig places a discovery process among its replicas. They share one lease
// table: each proxy is owned by one replica, chosen by hashing, which alone grants
// leases on it, so its maxLeases is counted in one place; every change to a lease is
// copied to the other replicas before the crawler is answered, so a replica that restarts
// (a rollout, a kill -9) takes its leases back from them before it serves them again.
// discovery/peer builds the Peers of a Server from it.
type ReplicaConfig struct {
	// Peers are the base URLs of every replica, this one included, by replica number (a
	// StatefulSet's pod ordinals). One or none: discovery runs alone, and its leases live
	// only in its memory.
	Peers []string
	// Self is this replica's number, its index in Peers.
	Self int
	// Tokens authenticate replicas to each other: the first is sent, any is accepted
	// (proxyauth.Keyring.PeerTokens).
	Tokens []string
	// RestoreLimit bounds how long a starting replica waits for every peer's copy of its
	// leases (default: the longest TTL). By then each lease it granted before it stopped
	// has expired unless renewed since, so starting without them oversubscribes nothing.
	RestoreLimit time.Duration
	// Timeout bounds each call to a peer (default 2s). An owner waits at most half of it
	// for its peers' copies of a change, so that it answers a replica that forwarded the
	// request before that replica gives up.
	Timeout time.Duration
}

// Validate checks the configuration (cmd/discovery's flags).
func (c ReplicaConfig) Validate() error {
	if len(c.Peers) <= 1 {
		return nil
	}
	if len(c.Peers) > 256 {
		return fmt.Errorf("--peers: at most 256 replicas, got %d", len(c.Peers))
	}
	if c.Self < 0 || c.Self >= len(c.Peers) {
		return fmt.Errorf("--replica %d is not a replica number of --peers (0 to %d)", c.Self, len(c.Peers)-1)
	}
	for i, p := range c.Peers {
		if !strings.HasPrefix(p, "http://") && !strings.HasPrefix(p, "https://") {
			return fmt.Errorf("--peers: replica %d's address %q is not an http:// or https:// URL", i, p)
		}
	}
	if len(c.Tokens) == 0 {
		return errors.New("replicas need the fleet key to authenticate each other")
	}
	return nil
}

// Peers is the rest of a replica set as the lease operations ask it; discovery/peer
// implements it over HTTP. A Server without Peers (nil) runs alone.
//
// The operations decide here, per call, whether this replica or another acts: a proxy's
// owner alone grants leases on it, a lease's owner alone renews, ends and takes reports
// on it. Peers only carries the question to the other replica and its answer back.
type Peers interface {
	// Self is this replica's number; Len counts the replicas, this one included.
	Self() int
	Len() int
	// Ready is nil once this replica can act on the leases it owns (it holds them all
	// again and its index is loaded), else the answer saying why not.
	Ready() error
	// CanGrant says whether a replica can grant leases now: this one once Ready, another
	// unless it just failed.
	CanGrant(replica int) bool
	// Replicate copies a lease's state to the other replicas; an error means none took it.
	Replicate(rec LeaseRecord) error
	// Grant asks replica owner to grant a lease on proxyID for w. ErrProxyUnavailable
	// says it refused (the proxy filled up or started resting since this replica heard);
	// passOver, when not nil, says it cannot grant now (it did not answer, or said so):
	// its proxies are passed over, and passOver is the answer if no other proxy is granted.
	Grant(ctx context.Context, owner int, proxyID string, w Want) (granted *LeaseResponse, passOver *APIError, err error)
	// EndGrant ends lease id, which owner granted for client's crawler that left before
	// it got the lease.
	EndGrant(ctx context.Context, owner int, client, id string) error
	// Renew, Release and Report forward a crawler's operation on lease id to owner, with
	// the crawler's Authorization auth, and return its answer.
	Renew(ctx context.Context, owner int, auth, id string, d time.Duration) (*LeaseResponse, error)
	Release(ctx context.Context, owner int, auth, id string) error
	Report(ctx context.Context, owner int, auth, id, result, target string) error
}

// OwnerOf is the replica of a set of n that owns the proxy proxyID: the one that alone
// grants leases on it. It is the highest hash of the proxy's ID with each replica's
// number (rendezvous hashing): every replica computes the same owner, and adding a
// replica moves only the proxies it now wins.
func OwnerOf(proxyID string, n int) int {
	best, owner := uint64(0), 0
	var num [4]byte
	for i := range n {
		h := sha256.New()
		h.Write([]byte(proxyID))
		binary.BigEndian.PutUint32(num[:], uint32(i))
		h.Write(num[:])
		if v := binary.BigEndian.Uint64(h.Sum(nil)[:8]); i == 0 || v > best {
			best, owner = v, i
		}
	}
	return owner
}

// Unavailable is the answer when the replica that must answer cannot now.
func Unavailable(format string, args ...any) *APIError {
	e := Errorf(codes.ReplicasUnavailable, format, args...)
	e.RetryAfterSeconds = 1
	return e
}

// acquireReplicated grants a lease in a replica set: this replica picks as it would
// alone, over every lease it knows of, and the proxy's owner grants. An owner that refuses
// (the proxy filled up or started resting since this replica heard) or cannot answer has
// that proxy, or all of its proxies, passed over on the next pick.
// Proxies that except names (when not nil) are passed over too.
func (s *Server) acquireReplicated(ctx context.Context, w Want, except func(string) bool) (*LeaseResponse, error) {
	p := s.peers
	refused := map[string]bool{}
	var lastErr error
	skip := func(id string) bool {
		if refused[id] || (except != nil && except(id)) {
			return true
		}
		if owner := OwnerOf(id, p.Len()); !p.CanGrant(owner) {
			// Not a 409: this proxy may well be free, its owner will answer soon.
			lastErr = Unavailable("replica %d, which owns proxies that could take the lease, cannot grant now", owner)
			return true
		}
		return false
	}
	for range maxPicks {
		if ctx.Err() != nil {
			return nil, errCrawlerLeft()
		}
		id, err := s.store.pick(w, skip)
		if nm, ok := errors.AsType[*NoMatch](err); ok && lastErr == nil {
			return nil, refusedAsFull(nm, len(refused))
		}
		if err != nil {
			if lastErr != nil {
				return nil, lastErr
			}
			return nil, err
		}
		owner := OwnerOf(id, p.Len())
		if owner == p.Self() {
			resp, err := s.GrantOwned(id, w)
			if errors.Is(err, ErrProxyUnavailable) {
				refused[id] = true
				continue
			}
			if err != nil {
				return nil, err
			}
			return s.handOver(ctx, owner, w.Client, resp)
		}
		granted, passOver, err := p.Grant(ctx, owner, id, w)
		switch {
		case passOver != nil:
			lastErr = passOver
			continue
		case errors.Is(err, ErrProxyUnavailable):
			refused[id] = true
			continue
		case err != nil:
			return nil, err
		}
		return s.handOver(ctx, owner, w.Client, granted)
	}
	if lastErr == nil {
		// Every pick lost the race for its proxy's last slot to other crawlers: the
		// fleet is as full as this replica can tell, which a 409 says.
		return nil, refusedAsFull(s.store.explain(w), len(refused))
	}
	return nil, lastErr
}

// errCrawlerLeft answers a crawler that hung up before its lease was granted: nobody
// reads it.
func errCrawlerLeft() error { return Unavailable("the crawler left before its lease was granted") }

// handOver hands a lease just granted to the crawler that asked, or, if it has left
// meanwhile, ends it on its owner: nobody would hold it, and it would take its slot for
// its whole TTL.
func (s *Server) handOver(ctx context.Context, owner int, client string, l *LeaseResponse) (*LeaseResponse, error) {
	if ctx.Err() == nil {
		return l, nil
	}
	if owner == s.peers.Self() {
		s.ReleaseOwned(client, l.LeaseID)
		return nil, errCrawlerLeft()
	}
	if err := s.peers.EndGrant(ctx, owner, client, l.LeaseID); err != nil {
		s.log.Info("a lease granted for a crawler that left was not ended: it frees up when it expires", "lease", l.LeaseID, "error", err)
	}
	return nil, errCrawlerLeft()
}

// refusedAsFull corrects a NoMatch for the proxies whose owners refused the lease: this
// replica's copy of their leases lagged, and counted them as free (which NoMatch reports
// as resting), when they had just filled up. They will free up soon, so the crawler is
// told to retry within a second at most.
func refusedAsFull(nm *NoMatch, refused int) *NoMatch {
	moved := min(refused, nm.InCooldown)
	nm.InCooldown -= moved
	nm.AtCapacity += moved
	if refused > 0 && (nm.RetryAfter == 0 || nm.RetryAfter > time.Second) {
		nm.RetryAfter = time.Second
	}
	return nm
}

// maxPicks bounds the proxies one acquire tries in a replica set: each refusal is one
// round trip to an owner, and a crawler is better served by a quick answer.
const maxPicks = 6

// GrantOwned grants a lease for w on a proxy this replica owns, in a replica set, and
// copies it to a peer before it is handed out: a lease no other replica knows of would be
// forgotten by a kill -9. The lease's TTL is w.TTL. discovery/httpapi calls it for the
// replica a crawler asked.
func (s *Server) GrantOwned(proxyID string, w Want) (*LeaseResponse, error) {
	if err := s.peers.Ready(); err != nil {
		return nil, err
	}
	l, err := s.store.Grant(proxyID, w)
	if err != nil {
		return nil, err
	}
	if err := s.replicateLease(l.ID); err != nil {
		s.store.Release(w.Client, l.ID)
		return nil, err
	}
	resp := leaseResponse(l, w.TTL)
	return &resp, nil
}

// replicateLease copies a lease's current state to the peers (a no-op alone).
func (s *Server) replicateLease(id string) error {
	if s.peers == nil {
		return nil
	}
	rec, ok := s.store.Record(id)
	if !ok {
		return nil
	}
	if err := s.peers.Replicate(rec); err != nil {
		s.log.Warn("lease change not copied to any replica", "error", err)
		return Unavailable("no other replica could take a copy of the lease; retry")
	}
	return nil
}
