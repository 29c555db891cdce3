// Command discovery serves the crawler-facing API: list, lease, renew, release and report.
// It reads proxy state from Temporal only, never from Kubernetes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.temporal.io/sdk/client"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/internal/cmdline"
	"github.com/proxyfleet/proxyfleet/internal/telemetry"
)

func main() { cmdline.Main("discovery", run) }

func run() error {
	temporal := cmdline.TemporalFlags()
	var (
		listen      = flag.String("listen", cmdline.Env("DISCOVERY_LISTEN", "127.0.0.1:8090"), "address of the API, /healthz, /readyz and /metrics (env DISCOVERY_LISTEN)")
		defaultTTL  = flag.Duration("default-ttl", 5*time.Minute, "lease TTL when a request gives none")
		maxTTL      = flag.Duration("max-ttl", time.Hour, "longest TTL a lease or renewal may ask for")
		rateLimited = flag.Duration("cooldown-rate-limited", 5*time.Minute, "cooldown of a proxy for a target after a rate_limited report")
		banned      = flag.Duration("cooldown-banned", 30*time.Minute, "cooldown of a proxy for a target after a banned report")
		refresh     = flag.Duration("refresh-interval", time.Second, "how often the index reads what changed in Temporal")
		fullEvery   = flag.Duration("full-resync-interval", 5*time.Minute, "how often the index re-reads every proxy")
	)
	flag.Parse()
	// The token comes from the environment only, so it never shows in a process listing.
	token := os.Getenv("DISCOVERY_TOKEN")
	log := slog.New(telemetry.LogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	stopTracing, err := telemetry.SetupTracing(context.Background(), "proxyfleet-discovery")
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	defer func() { _ = stopTracing(context.Background()) }()
	opts, err := temporal.ClientOptions(log)
	if err != nil {
		return err
	}
	tc, err := client.NewLazyClient(opts)
	if err != nil {
		return err
	}
	defer tc.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	store := discovery.NewStore(max(*rateLimited, *banned))
	srv := discovery.NewServer(discovery.Config{
		Token: token, DefaultTTL: *defaultTTL, MaxTTL: *maxTTL,
		CooldownRateLimited: *rateLimited, CooldownBanned: *banned,
	}, store, discovery.TemporalSignaler{Client: tc}, log, reg)
	refresher := &discovery.Refresher{Client: tc, Namespace: temporal.Namespace, Store: store,
		Interval: *refresh, FullEvery: *fullEvery, Log: log, Observe: srv.ObserveRefresh}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The listener does not wait for the first full pass: /healthz answers at once (the
	// process is alive even when Temporal is not), while /readyz, listings and acquires
	// answer 503 index_loading until the index is loaded.
	go func() { _ = refresher.Run(ctx) }()
	go srv.RunReports(ctx)
	go store.RunSweeper(ctx, time.Second)

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	log.Info("discovery listening", "addr", ln.Addr().String(), "temporal", temporal.Address)
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
