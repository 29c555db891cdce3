// Package httpapi is discovery's HTTP API, in Gin: the routes crawlers call (/v1, with
// /healthz, /readyz and /metrics) and those replicas call each other on (/peer/v1), their
// middleware (authentication, rate limits, body limits, logging, tracing), the JSON error
// answers made from discovery/codes, the HTTP metrics, and openapi.yaml, which its test
// holds to the routes.
//
// It exists so that the lease domain (package discovery) knows nothing of HTTP: each
// handler reads a request, calls one of the domain's lease operations and writes what it
// returns. A request on a lease another replica owns is forwarded to it through
// discovery/peer.
package httpapi

import (
	"log/slog"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/github.com/gin-gonic/gin/otelgin"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/codes"
	"github.com/proxyfleet/proxyfleet/discovery/peer"
)

// Server serves the lease operations of ops over HTTP.
type Server struct {
	ops     *discovery.Server
	cfg     discovery.Config
	log     *slog.Logger
	metrics *metrics
	// peers is nil when discovery runs alone.
	peers *peer.Set
}

// New builds the HTTP API over ops, in the replica set peers (nil alone). Its metrics go
// to reg when it is not nil, and /metrics serves reg when it is also a Gatherer.
func New(ops *discovery.Server, peers *peer.Set, log *slog.Logger, reg prometheus.Registerer) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{ops: ops, cfg: ops.Config(), log: log, metrics: newMetrics(reg), peers: peers}
}

// Handler returns the HTTP handler with every route and middleware.
func (s *Server) Handler() http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.HandleMethodNotAllowed = true
	// Nil trusts no proxy. cmd/discovery checks the list at start; a bad entry here (a
	// test's config) is logged, and Gin then trusts none.
	if err := r.SetTrustedProxies(s.cfg.TrustedProxies); err != nil {
		s.log.Error("trusted proxies", "error", err)
		_ = r.SetTrustedProxies(nil)
	}
	// A trailing slash or odd case gets a JSON 404, not a redirect with an HTML body.
	r.RedirectTrailingSlash, r.RedirectFixedPath = false, false
	// Server spans continue an incoming traceparent; probes and metrics scrapes are noise.
	r.Use(otelgin.Middleware("proxyfleet-discovery", otelgin.WithGinFilter(func(c *gin.Context) bool {
		return !probeRoute(c.FullPath())
	})))
	// logRequests wraps recoverPanics so a recovered panic is logged and counted as the 500
	// it answers.
	r.Use(s.logRequests, s.recoverPanics, s.limitBody)
	r.NoRoute(func(c *gin.Context) {
		s.fail(c, discovery.Errorf(codes.NotFound, "no such route: %s %s", c.Request.Method, c.Request.URL.Path))
	})
	r.NoMethod(func(c *gin.Context) {
		s.fail(c, discovery.Errorf(codes.MethodNotAllowed, "%s is not allowed on %s", c.Request.Method, c.Request.URL.Path))
	})
	healthz := func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) }
	r.GET("/healthz", healthz)
	r.HEAD("/healthz", func(c *gin.Context) { c.Status(http.StatusOK) })
	// /healthz is liveness (the process serves); /readyz is readiness (it has something
	// true to serve). Restarting a replica whose Temporal is down would not help, taking it
	// out of the Service until its index loads does.
	r.GET("/readyz", s.readyz)
	r.HEAD("/readyz", s.readyz)
	if s.metrics.handler != nil {
		r.GET("/metrics", gin.WrapH(s.metrics.handler))
	}
	v1 := r.Group("/v1", s.authenticate)
	// Only the answers that depend on the whole index wait for it. Renew, release and
	// report work on leases, which live in memory and are all this process has granted.
	v1.GET("/proxies", s.requireIndex, s.listProxies)
	v1.GET("/demand", s.requireIndex, s.demand)
	v1.POST("/leases", s.requireIndex, s.acquire)
	v1.POST("/leases/:id/renew", s.routeLease, s.renew)
	v1.DELETE("/leases/:id", s.routeLease, s.release)
	v1.POST("/leases/:id/report", s.routeLease, s.report)
	v1.POST("/sessions/:session/report", s.reportSession)
	if s.peers != nil {
		peer := r.Group("/peer/v1", s.authenticatePeer)
		peer.POST("/leases", s.peerApply)
		peer.GET("/leases", s.peerSnapshot)
		peer.POST("/grant", s.peerGrant)
		peer.POST("/release", s.peerReleaseLease)
		peer.GET("/demand", s.peerDemand)
	}
	return r
}

// routeLease sends a request on a lease to the replica that owns it (see ownLease).
func (s *Server) routeLease(c *gin.Context) {
	if s.ownLease(c) {
		c.Next()
	}
}

// fail answers with err, as discovery.ErrorOf maps it. An internal error is logged, never
// shown.
func (s *Server) fail(c *gin.Context, err error) {
	ae, known := discovery.ErrorOf(err)
	if !known {
		s.log.Error("internal error", "method", c.Request.Method, "path", c.FullPath(), "error", err)
	}
	if ae.RetryAfterSeconds > 0 {
		c.Header("Retry-After", strconv.Itoa(ae.RetryAfterSeconds))
	}
	c.AbortWithStatusJSON(codes.Status(ae.Code), ae)
}
