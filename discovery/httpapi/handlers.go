package httpapi

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

func (s *Server) listProxies(c *gin.Context) {
	for name := range c.Request.URL.Query() {
		// An unknown parameter (region=eu for attr.region=eu, say) would otherwise be
		// ignored, and the answer would list proxies the caller meant to exclude.
		if name != "healthy" && !strings.HasPrefix(name, "attr.") {
			s.fail(c, discovery.Errorf(codes.Invalid, "unknown query parameter %q: select by attribute with attr.<key>=<value>, or filter with healthy=true|false", name))
			return
		}
	}
	sel, err := discovery.ParseQuerySelector(c.Request.URL.Query())
	if err != nil {
		s.fail(c, discovery.Errorf(codes.InvalidSelector, "%v", err))
		return
	}
	var healthy *bool
	if h := c.Query("healthy"); h != "" {
		v, err := strconv.ParseBool(h)
		if err != nil {
			s.fail(c, discovery.Errorf(codes.Invalid, "healthy must be true or false, got %q", h))
			return
		}
		healthy = &v
	}
	c.JSON(http.StatusOK, s.ops.ListProxies(sel, healthy))
}

// demand answers the demand on the proxies a selector describes (a pool's attributes),
// over every replica; asking watches the selector (see discovery.Demand).
func (s *Server) demand(c *gin.Context) {
	sel, ok := s.selectorOnly(c)
	if !ok {
		return
	}
	d := s.ops.Demand(sel)
	if s.peers != nil {
		d = s.peers.Demand(c.Request.Context(), d)
	}
	c.JSON(http.StatusOK, d)
}

// selectorOnly reads a query of attr.<key>=<value> parameters and nothing else.
func (s *Server) selectorOnly(c *gin.Context) (discovery.Selector, bool) {
	for name := range c.Request.URL.Query() {
		if !strings.HasPrefix(name, "attr.") {
			s.fail(c, discovery.Errorf(codes.Invalid, "unknown query parameter %q: select by attribute with attr.<key>=<value>", name))
			return nil, false
		}
	}
	sel, err := discovery.ParseQuerySelector(c.Request.URL.Query())
	if err != nil {
		s.fail(c, discovery.Errorf(codes.InvalidSelector, "%v", err))
		return nil, false
	}
	return sel, true
}

func (s *Server) acquire(c *gin.Context) {
	start := time.Now()
	var req discovery.LeaseRequest
	var d, wait time.Duration
	err := s.decode(c, &req, true)
	if err == nil {
		d, err = req.Validate(s.cfg)
	}
	if err == nil {
		wait, err = s.cfg.Wait(req.WaitSeconds)
	}
	if err != nil {
		s.metrics.leaseRequests.WithLabelValues("invalid").Inc()
		s.fail(c, err)
		return
	}
	w := discovery.Want{Selector: req.Selector, Target: req.Target, Session: req.Session, TTL: d}
	if cl := clientOf(c); cl != nil {
		w.Client, w.MaxLeases = cl.Name(), cl.MaxLeases()
	}
	resp, err := s.ops.GrantWaiting(c.Request.Context(), w, wait)
	if err != nil {
		if _, ok := errors.AsType[*discovery.NoMatch](err); ok {
			s.metrics.leaseRequests.WithLabelValues("no_match").Inc()
		}
		if _, ok := errors.AsType[*discovery.LeaseLimit](err); ok {
			s.ops.LeaseLimited(w.Client)
		}
		s.fail(c, discovery.AcquireError(req.Target, err))
		return
	}
	s.metrics.leaseRequests.WithLabelValues("granted").Inc()
	s.metrics.acquireSeconds.Observe(time.Since(start).Seconds())
	c.JSON(http.StatusCreated, resp)
}

func (s *Server) renew(c *gin.Context) {
	var req discovery.RenewRequest
	if err := s.decode(c, &req, true); err != nil {
		s.fail(c, err)
		return
	}
	d, err := s.cfg.TTL(req.TTLSeconds)
	if err != nil {
		s.fail(c, err)
		return
	}
	resp, err := s.ops.RenewOwned(clientName(c), c.Param("id"), d)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, resp)
}

func (s *Server) release(c *gin.Context) {
	s.ops.ReleaseOwned(clientName(c), c.Param("id"))
	c.Status(http.StatusNoContent)
}

func (s *Server) report(c *gin.Context) {
	var req discovery.ReportRequest
	if err := s.decode(c, &req, false); err != nil {
		s.fail(c, err)
		return
	}
	if err := s.ops.ReportOwned(clientName(c), c.Param("id"), req.Result, req.Target); err != nil {
		s.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

// reportSession serves POST /v1/sessions/{session}/report: a report on the latest lease
// of one of the client's sessions. It is how a crawler of the gateway, which never sees
// a lease ID inside a tunnel, tells discovery that the site banned the proxy it was on.
func (s *Server) reportSession(c *gin.Context) {
	var req discovery.ReportRequest
	if err := s.decode(c, &req, false); err != nil {
		s.fail(c, err)
		return
	}
	err := s.ops.ReportSession(c.Request.Context(), c.GetHeader("Authorization"), clientName(c), c.Param("session"), req.Result, req.Target)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}
