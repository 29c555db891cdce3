// Package service assembles discovery's process from the lease domain and its adapters:
// the HTTP API, the gateway, the replica set and the Temporal index reader. It sits above
// all of them so that none of them has to know the others, and so that cmd/discovery and
// the test stack build one process the same way.
package service

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
	"github.com/proxyfleet/proxyfleet/discovery/httpapi"
	"github.com/proxyfleet/proxyfleet/discovery/peer"
	"github.com/proxyfleet/proxyfleet/discovery/temporal"
	"github.com/proxyfleet/proxyfleet/internal/httpserve"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// Config configures a whole discovery process.
type Config struct {
	// API configures the HTTP API (token, TTLs, cooldowns).
	API discovery.Config
	// Replicas places this process among discovery's replicas; empty, it runs alone.
	Replicas discovery.ReplicaConfig
	// Namespace is the Temporal namespace the proxies' workflows run in.
	Namespace string
	// RefreshInterval and FullResyncInterval pace the index refresher (see temporal.Refresher).
	RefreshInterval, FullResyncInterval time.Duration
	// SweepInterval is how often expired leases are freed (default 1s).
	SweepInterval time.Duration
	// Keyring holds the fleet key, shared with the worker only, that the credentials of
	// proxies are derived from or sealed with. It belongs here rather than in the API's
	// Config because credentials are resolved as memos are read from Temporal, not per
	// request. Without one, no proxy that takes credentials is leased (cmd/discovery
	// refuses to start without it).
	Keyring *proxyauth.Keyring
	// ClientsFile is the file API.Clients was loaded from, reloaded every ClientsReload
	// (default 5s) while discovery runs; empty when there is none.
	ClientsFile   string
	ClientsReload time.Duration
	// Gateway configures the gateway, which ServeWithGateway serves.
	Gateway gateway.Config
}

// Temporal is the part of the Temporal client discovery uses: it lists workflows for the
// index and signals reports to them.
type Temporal interface {
	temporal.Lister
	SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
}

// Service is discovery assembled: the lease store, the API over it, the refresher that
// keeps its index in step with Temporal, the sweeper of expired leases and the loop that
// forwards reports to workflows. cmd/discovery and the test stack both run one, so tests
// exercise the wiring production runs.
type Service struct {
	// Store is the lease store, for tests that look inside.
	Store     *discovery.Store
	api       *API
	gateway   *gateway.Gateway
	refresher *temporal.Refresher
	sweep     time.Duration
	log       *slog.Logger
	// clientsFile and clientsReload configure the reload of the clients file.
	clientsFile   string
	clientsReload time.Duration
}

// API is one discovery replica's lease operations with the HTTP API over them, in its
// replica set or alone: what Service serves, and what tests build a replica from.
type API struct {
	// Server is the lease operations, which the gateway serves too.
	*discovery.Server
	peers *peer.Set
	http  *httpapi.Server
}

// NewAPI assembles a replica that runs alone: the lease operations over store and the HTTP
// API. Metrics go to reg when it is not nil.
func NewAPI(cfg discovery.Config, store *discovery.Store, signal discovery.Signaler, log *slog.Logger, reg prometheus.Registerer) *API {
	return NewReplica(cfg, discovery.ReplicaConfig{}, store, signal, log, reg)
}

// NewReplica assembles replica rc.Self of the set rc describes (alone when it names one
// replica or none): its peers, the lease operations over store asking them, and the HTTP
// API. Metrics go to reg when it is not nil.
func NewReplica(cfg discovery.Config, rc discovery.ReplicaConfig, store *discovery.Store, signal discovery.Signaler, log *slog.Logger, reg prometheus.Registerer) *API {
	if log == nil {
		log = slog.Default()
	}
	cfg = cfg.WithDefaults()
	if rc.RestoreLimit <= 0 {
		rc.RestoreLimit = cfg.MaxTTL
	}
	peers := peer.New(rc, store, log, reg)
	var asked discovery.Peers
	if peers != nil { // a nil *peer.Set would make a Peers that is not nil
		asked = peers
	}
	srv := discovery.NewServer(cfg, store, asked, signal, log, reg)
	return &API{Server: srv, peers: peers, http: httpapi.New(srv, peers, log, reg)}
}

// Handler returns the HTTP API's handler, every route and middleware.
func (a *API) Handler() http.Handler { return a.http.Handler() }

// RunReplicas restores this replica's leases from its peers, then returns; alone it
// returns at once. Until it has, the replica grants, renews and ends none of its own
// leases and is not ready.
func (a *API) RunReplicas(ctx context.Context) {
	if a.peers != nil {
		a.peers.Restore(ctx)
	}
}

// MaxHeaderBytes bounds a request's headers: a bearer token and a traceparent need far less.
const MaxHeaderBytes = 16 << 10

// New assembles discovery. Metrics go to reg when it is not nil.
func New(cfg Config, tc Temporal, log *slog.Logger, reg prometheus.Registerer) *Service {
	if log == nil {
		log = slog.Default()
	}
	cfg.API = cfg.API.WithDefaults()
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = time.Second
	}
	// A lease stays known after it ends for as long as a report about it can still matter:
	// the longest cooldown a report can start.
	store := discovery.NewStoreWith(discovery.StoreConfig{KeepEnded: max(cfg.API.CooldownRateLimited, cfg.API.CooldownBanned),
		Replica: byte(cfg.Replicas.Self)})
	api := NewReplica(cfg.API, cfg.Replicas, store, temporal.Signaler{Client: tc}, log, reg)
	ref := &temporal.Refresher{Client: tc, Namespace: cfg.Namespace, Store: store, Keyring: cfg.Keyring,
		Interval: cfg.RefreshInterval, FullEvery: cfg.FullResyncInterval, Log: log, Observe: api.ObserveRefresh}
	if cfg.Keyring == nil {
		log.Warn("discovery runs without a fleet key: proxies that take credentials are never leased")
	}
	if cfg.ClientsReload <= 0 {
		cfg.ClientsReload = 5 * time.Second
	}
	return &Service{Store: store, api: api, gateway: gateway.New(cfg.Gateway, api.Server, log, reg), refresher: ref, sweep: cfg.SweepInterval, log: log,
		clientsFile: cfg.ClientsFile, clientsReload: cfg.ClientsReload}
}

// Serve runs the refresher, the report loop and the sweeper, and serves the API on ln until
// ctx ends; then it stops accepting, gives requests in flight up to 10s, forwards the
// reports still queued (up to 10s more), and returns nil once every loop has stopped. Requests cut off by that bound are logged, not an error of
// the process: it was asked to stop.
//
// It does not wait for the first index load: /healthz answers at once (the process is
// alive even when Temporal is not), while /readyz, listings and acquires answer 503
// index_loading until the index is loaded.
func (s *Service) Serve(ctx context.Context, ln net.Listener) error {
	return s.ServeWithGateway(ctx, ln, nil)
}

// ServeWithGateway is Serve, with the gateway on gw too (when not nil): the fleet as one
// forward proxy, over the same leases. When ctx ends the gateway stops with the API, and
// the reports its requests queued are forwarded with the API's.
func (s *Service) ServeWithGateway(ctx context.Context, ln, gw net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	loops := make(chan struct{}, 5)
	go func() { _ = s.refresher.Run(ctx); loops <- struct{}{} }()
	go func() { s.api.RunReplicas(ctx); loops <- struct{}{} }()
	go func() {
		if s.clientsFile != "" {
			s.api.WatchClients(ctx, s.clientsFile, s.clientsReload)
		}
		loops <- struct{}{}
	}()
	// The report loop outlives the API: requests still in flight at shutdown may queue
	// reports, and it forwards everything queued before it returns.
	reportsCtx, stopReports := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReports()
	go func() { s.api.RunReports(reportsCtx); loops <- struct{}{} }()
	go func() { s.Store.RunSweeper(ctx, s.sweep); loops <- struct{}{} }()
	gatewayDone := make(chan struct{})
	go func() {
		defer close(gatewayDone)
		if gw != nil {
			if err := s.gateway.Serve(ctx, gw); err != nil {
				s.log.Error("gateway stopped", "error", err)
			}
		}
	}()

	// Bounded reads, writes and headers: a client that trickles a request or never reads
	// its answer holds a connection for seconds, not forever. Every answer is small and
	// quick, so a minute to write one is generous, after the longest an acquire may wait
	// for a proxy (waitSeconds).
	hs := &http.Server{Handler: s.api.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: time.Minute + s.api.Config().MaxAcquireWait, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: MaxHeaderBytes}
	go func() {
		// Acquires waiting for a proxy are answered (503, retry) as the server stops, not
		// cut off when its wait for the requests in flight runs out.
		<-ctx.Done()
		s.api.StopWaiting()
	}()
	err, serr := httpserve.Until(ctx, hs, ln)
	cancel()
	if serr != nil {
		s.log.Warn("requests still in flight when discovery stopped were cut off", "error", serr)
	}
	<-gatewayDone
	stopReports()
	for range 5 {
		<-loops
	}
	return err
}
