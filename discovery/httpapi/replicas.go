package httpapi

// The routes of a replica set: a crawler's request on a lease is forwarded to the replica
// that owns it, and /peer/v1 serves the calls replicas make to each other (discovery/peer
// makes them).

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/codes"
	"github.com/proxyfleet/proxyfleet/discovery/peer"
)

// ownLease routes a request on a lease: it returns true when this replica answers it,
// having forwarded it to the lease's owner and relayed the answer otherwise.
func (s *Server) ownLease(c *gin.Context) bool {
	r := s.peers
	if r == nil {
		return true
	}
	owner, ok := discovery.LeaseOwner(c.Param("id"))
	if !ok || owner >= r.Len() {
		return true // not a lease ID of this set: answered as unknown
	}
	if owner == r.Self() {
		if err := r.Ready(); err != nil {
			s.fail(c, err)
			return false
		}
		return true
	}
	if c.GetHeader(peer.ForwardedHeader) != "" {
		s.fail(c, discovery.Unavailable("replica %s forwarded lease %q here, but replica %d owns it: the replicas' --peers differ", c.GetHeader(peer.ForwardedHeader), c.Param("id"), owner))
		return false
	}
	body, err := io.ReadAll(c.Request.Body)
	if err != nil {
		s.fail(c, discovery.Errorf(codes.TooLarge, "request body exceeds %d bytes", s.cfg.BodyLimit))
		return false
	}
	if len(body) == 0 {
		body = nil
	}
	resp, err := r.Forward(c.Request.Context(), owner, c.Request.Method, c.Request.URL.RequestURI(), body,
		c.Request.Header.Values("Authorization"))
	if err != nil {
		s.fail(c, discovery.Unavailable("replica %d, which owns lease %q, did not answer", owner, c.Param("id")))
		return false
	}
	relay(c, resp)
	return false
}

// authenticatePeer admits only other replicas.
func (s *Server) authenticatePeer(c *gin.Context) {
	if s.peers.Authorized(c.Request) {
		c.Next()
		return
	}
	s.fail(c, discovery.Errorf(codes.Unauthorized, "only discovery's replicas may call this route"))
}

// relay answers the crawler with a peer's answer as it is.
func relay(c *gin.Context, resp *http.Response) {
	defer resp.Body.Close()
	for _, h := range []string{"Content-Type", "Retry-After", "WWW-Authenticate"} {
		if v := resp.Header.Get(h); v != "" {
			c.Header(h, v)
		}
	}
	c.Status(resp.StatusCode)
	_, _ = io.Copy(c.Writer, resp.Body)
	c.Abort()
}

// peerApply takes lease changes from their owner.
func (s *Server) peerApply(c *gin.Context) {
	var recs []discovery.LeaseRecord
	if err := json.NewDecoder(c.Request.Body).Decode(&recs); err != nil {
		s.fail(c, discovery.Errorf(codes.Invalid, "lease records: %v", err))
		return
	}
	s.peers.Apply(recs, c.GetHeader(peer.ForwardedHeader))
	c.Status(http.StatusNoContent)
}

// peerSnapshot serves a starting replica its leases.
func (s *Server) peerSnapshot(c *gin.Context) {
	owner, err := strconv.Atoi(c.Query("owner"))
	if err != nil {
		s.fail(c, discovery.Errorf(codes.Invalid, "owner must be a replica number"))
		return
	}
	c.JSON(http.StatusOK, s.peers.Snapshot(owner))
}

// peerDemand answers this replica's own part of a selector's demand.
func (s *Server) peerDemand(c *gin.Context) {
	if sel, ok := s.selectorOnly(c); ok {
		c.JSON(http.StatusOK, s.ops.DemandPart(sel))
	}
}

// peerGrant grants a lease on a proxy this replica owns, for the replica a crawler asked.
func (s *Server) peerGrant(c *gin.Context) {
	var req peer.GrantRequest
	if err := discovery.DecodeJSON(c.Request.Body, &req, false); err != nil {
		s.fail(c, err)
		return
	}
	d, err := s.cfg.TTL(req.TTLSeconds)
	if err != nil {
		s.fail(c, err)
		return
	}
	if discovery.OwnerOf(req.ProxyID, s.peers.Len()) != s.peers.Self() {
		s.fail(c, discovery.Errorf(codes.ProxyUnavailable, "this replica does not own proxy %q: the replicas' --peers differ", req.ProxyID))
		return
	}
	l, err := s.ops.GrantOwned(req.ProxyID, discovery.Want{Selector: req.Selector, Target: req.Target, Session: req.Session, TTL: d,
		Client: req.Client, MaxLeases: req.MaxLeases})
	if errors.Is(err, discovery.ErrProxyUnavailable) {
		s.fail(c, discovery.Errorf(codes.ProxyUnavailable, "proxy %q cannot take the lease now", req.ProxyID))
		return
	}
	if err != nil {
		s.fail(c, err)
		return
	}
	if c.Request.Context().Err() != nil {
		// The replica that asked gave up before the copies were taken (its timeout, or
		// it went away): nobody will hold this lease.
		s.ops.ReleaseOwned(req.Client, l.LeaseID)
		return
	}
	s.metrics.leaseRequests.WithLabelValues("granted").Inc()
	c.JSON(http.StatusCreated, l)
}

// peerReleaseLease ends a lease this replica granted for another replica whose crawler
// left before it got it.
func (s *Server) peerReleaseLease(c *gin.Context) {
	var req peer.EndGrantRequest
	if err := discovery.DecodeJSON(c.Request.Body, &req, false); err != nil {
		s.fail(c, err)
		return
	}
	if owner, ok := discovery.LeaseOwner(req.LeaseID); ok && owner == s.peers.Self() {
		if err := s.peers.Ready(); err != nil {
			s.fail(c, err)
			return
		}
		s.ops.ReleaseOwned(req.Client, req.LeaseID)
	}
	c.Status(http.StatusNoContent)
}
