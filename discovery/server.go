package discovery

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/github.com/gin-gonic/gin/otelgin"

	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

// Config configures the API.
type Config struct {
	// Token is the bearer token crawlers present, admitted as the client "default".
	// Clients, when set, admits named clients instead (and Token is ignored). With
	// neither, authentication is off (loudly).
	Token   string
	Clients *Clients
	// DefaultTTL applies when a lease request has no ttlSeconds; MaxTTL is the most a
	// lease or renewal may ask for (more is a 400, not a silent clamp).
	DefaultTTL, MaxTTL time.Duration
	// CooldownRateLimited and CooldownBanned are how long a proxy rests for a target after
	// such a report.
	CooldownRateLimited, CooldownBanned time.Duration
	// BodyLimit caps request bodies (default 64 KiB).
	BodyLimit int64
	// TrustedProxies are the addresses or CIDRs of load balancers whose X-Forwarded-For
	// names the client in logs. Empty trusts none: any caller could otherwise write any
	// address into the logs.
	TrustedProxies []string
	// Replicas places this process among discovery's replicas; empty, it runs alone.
	Replicas ReplicaConfig
}

// Defaults of Config; cmd/discovery's flags default to them too.
const (
	DefaultTTL                 = 5 * time.Minute
	DefaultMaxTTL              = time.Hour
	DefaultCooldownRateLimited = 5 * time.Minute
	DefaultCooldownBanned      = 30 * time.Minute
	DefaultBodyLimit           = 64 << 10
)

// WithDefaults is c with every unset field at its default, as NewServer uses it.
func (c Config) WithDefaults() Config {
	c.defaults()
	return c
}

func (c *Config) defaults() {
	orDefault(&c.DefaultTTL, DefaultTTL)
	orDefault(&c.MaxTTL, DefaultMaxTTL)
	orDefault(&c.CooldownRateLimited, DefaultCooldownRateLimited)
	orDefault(&c.CooldownBanned, DefaultCooldownBanned)
	if c.BodyLimit <= 0 {
		c.BodyLimit = DefaultBodyLimit
	}
}

// orDefault sets a zero or negative duration to def.
func orDefault(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

// Server is the discovery API.
type Server struct {
	cfg     Config
	store   *Store
	signal  Signaler
	log     *slog.Logger
	metrics *serverMetrics
	// reports queues durable report signals, so a slow Temporal never slows a crawler.
	reports chan pendingReport
	// coalesce keeps repeated reports of one cooldown from becoming repeated signals.
	coalesce coalescer
	// replicas is nil when discovery runs alone.
	replicas *replicas
	// clients is nil when authentication is off.
	clients *Clients
}

// NewServer builds the API. reg may be nil (no metrics).
func NewServer(cfg Config, store *Store, signal Signaler, log *slog.Logger, reg prometheus.Registerer) *Server {
	cfg.defaults()
	if log == nil {
		log = slog.Default()
	}
	s := &Server{cfg: cfg, store: store, signal: signal, log: log, reports: make(chan pendingReport, 4096)}
	s.clients = cfg.Clients
	if s.clients == nil && cfg.Token != "" {
		s.clients = singleClient(cfg.Token)
	}
	s.metrics = newServerMetrics(reg, store, s.clients)
	if cfg.Replicas.RestoreLimit <= 0 {
		cfg.Replicas.RestoreLimit = cfg.MaxTTL
	}
	s.replicas = newReplicas(cfg.Replicas, store, log, s.metrics)
	if s.clients == nil {
		log.Warn("WARNING: discovery runs WITHOUT authentication: no bearer token is configured; anyone who can reach it can lease proxies")
	}
	return s
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
		s.fail(c, Errorf(codes.NotFound, "no such route: %s %s", c.Request.Method, c.Request.URL.Path))
	})
	r.NoMethod(func(c *gin.Context) {
		s.fail(c, Errorf(codes.MethodNotAllowed, "%s is not allowed on %s", c.Request.Method, c.Request.URL.Path))
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
	v1.POST("/leases", s.requireIndex, s.acquire)
	v1.POST("/leases/:id/renew", s.routeLease, s.renew)
	v1.DELETE("/leases/:id", s.routeLease, s.release)
	v1.POST("/leases/:id/report", s.routeLease, s.report)
	v1.POST("/sessions/:session/report", s.reportSession)
	if s.replicas != nil {
		peer := r.Group("/peer/v1", s.authenticatePeer)
		peer.POST("/leases", s.peerApply)
		peer.GET("/leases", s.peerSnapshot)
		peer.POST("/grant", s.peerGrant)
		peer.POST("/release", s.peerReleaseLease)
	}
	return r
}

// RunReplicas restores this replica's leases from its peers, then returns; alone it
// returns at once. Until it has, the replica grants, renews and ends none of its own
// leases and is not ready.
func (s *Server) RunReplicas(ctx context.Context) {
	if s.replicas != nil {
		s.replicas.restore(ctx)
	}
}

// WatchClients reloads the clients file at path every interval until ctx ends (see
// Clients.Watch); without clients (authentication off) there is nothing to reload.
func (s *Server) WatchClients(ctx context.Context, path string, interval time.Duration) {
	if s.clients != nil {
		s.clients.Watch(ctx, path, interval, s.log, s.metrics.clientsReloadErrors.Inc)
	}
}

// routeLease sends a request on a lease to the replica that owns it (see ownLease).
func (s *Server) routeLease(c *gin.Context) {
	if s.ownLease(c) {
		c.Next()
	}
}

// restored reports whether this replica holds every lease it owns.
func (s *Server) restored() bool { return s.replicas == nil || s.replicas.restored.Load() }
