package discovery

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures the lease operations and the API over them.
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
	// MaxAcquireWait is the longest wait an acquire may ask for (waitSeconds; more is a
	// 400). Default DefaultMaxAcquireWait.
	MaxAcquireWait time.Duration
	// BodyLimit caps request bodies (default 64 KiB).
	BodyLimit int64
	// TrustedProxies are the addresses or CIDRs of load balancers whose X-Forwarded-For
	// names the client in logs. Empty trusts none: any caller could otherwise write any
	// address into the logs.
	TrustedProxies []string
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
	orDefault(&c.MaxAcquireWait, DefaultMaxAcquireWait)
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

// Server is the lease operations over a store: what the HTTP API (discovery/httpapi) and
// the gateway serve, alone or in a replica set.
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
	// peers is nil when discovery runs alone.
	peers Peers
	// clients is nil when authentication is off.
	clients *Clients
	// waiters are the acquires waiting for a proxy (GrantWaiting), woken by the store;
	// waitChecks counts the grants they tried again.
	waiters    waitQueue
	waitChecks atomic.Int64
	// demand remembers refusals and the selectors whose demand is watched (demand.go).
	demand demandBook
	// waitsStopped is closed once discovery stops (StopWaiting): waits end at once.
	waitsStopped chan struct{}
	stopWaits    sync.Once
}

// NewServer builds the lease operations over store, asking peers (the rest of the replica
// set; nil: this server runs alone) which replica acts. reg may be nil (no metrics).
func NewServer(cfg Config, store *Store, peers Peers, signal Signaler, log *slog.Logger, reg prometheus.Registerer) *Server {
	cfg.defaults()
	if log == nil {
		log = slog.Default()
	}
	s := &Server{cfg: cfg, store: store, signal: signal, log: log, reports: make(chan pendingReport, 4096), peers: peers,
		waitsStopped: make(chan struct{})}
	s.clients = cfg.Clients
	if s.clients == nil && cfg.Token != "" {
		s.clients = singleClient(cfg.Token)
	}
	s.metrics = newServerMetrics(reg, store, s.clients)
	if reg != nil {
		reg.MustRegister(newDemandCollector(s))
	}
	store.notifyFreed(s.waiters.Wake)
	if s.clients == nil {
		log.Warn("WARNING: discovery runs WITHOUT authentication: no bearer token is configured; anyone who can reach it can lease proxies")
	}
	return s
}

// WatchClients reloads the clients file at path every interval until ctx ends (see
// Clients.Watch); without clients (authentication off) there is nothing to reload.
func (s *Server) WatchClients(ctx context.Context, path string, interval time.Duration) {
	if s.clients != nil {
		s.clients.Watch(ctx, path, interval, s.log, s.metrics.clientsReloadErrors.Inc)
	}
}
