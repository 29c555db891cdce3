// Package cmdline holds what every binary's main shares: flags that default from the
// environment, the Temporal connection flags and client, and the process prologue (flag
// parsing, logger, tracing, signal handling, exit code). Keeping them in one place keeps
// flag names, env names and help text the same across binaries (deploy/ and
// docker-compose.yaml are tested against them), and leaves each main as its flags and one
// call.
package cmdline

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	tlog "go.temporal.io/sdk/log"

	"github.com/proxyfleet/proxyfleet/internal/telemetry"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Env returns the environment variable key, or def when it is unset or empty.
func Env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Temporal are the flags that locate the Temporal server and secure the connection.
type Temporal struct {
	Address, Namespace string
	Security           TemporalSecurity
}

// TemporalFlags registers --temporal-address, --temporal-namespace and the TLS and API key
// flags (see TemporalSecurity).
func TemporalFlags() *Temporal {
	t := &Temporal{}
	t.securityFlags()
	flag.StringVar(&t.Address, "temporal-address", Env("TEMPORAL_ADDRESS", "127.0.0.1:7233"), "Temporal frontend host:port (env TEMPORAL_ADDRESS)")
	flag.StringVar(&t.Namespace, "temporal-namespace", Env("TEMPORAL_NAMESPACE", "default"), "Temporal namespace (env TEMPORAL_NAMESPACE)")
	return t
}

// TaskQueueVar defines --task-queue (env TASK_QUEUE), the queue the operator starts
// workflows on and the worker polls: both must agree.
func TaskQueueVar(p *string, usage string) {
	flag.StringVar(p, "task-queue", Env("TASK_QUEUE", contract.TaskQueue), usage+" (env TASK_QUEUE)")
}

// InstallationVar defines --installation (env PROXYFLEET_INSTALLATION, default "default"),
// the id the operator hands to workflows and the worker's orphan sweep trusts.
func InstallationVar(p *string, usage string) {
	flag.StringVar(p, "installation", Env("PROXYFLEET_INSTALLATION", "default"), usage+" (env PROXYFLEET_INSTALLATION)")
}

// ClientOptions are the Temporal client options every binary starts from: these flags, the
// process's logger, and the tracing interceptor (it traces nothing unless OTEL_* variables
// set tracing up).
func (t *Temporal) ClientOptions(log *slog.Logger) (client.Options, error) {
	tracing, err := telemetry.TemporalInterceptor()
	if err != nil {
		return client.Options{}, err
	}
	opts := client.Options{
		HostPort: t.Address, Namespace: t.Namespace,
		Logger:       tlog.NewStructuredLogger(log),
		Interceptors: []interceptor.ClientInterceptor{tracing},
	}
	if err := t.Security.apply(&opts); err != nil {
		return client.Options{}, err
	}
	return opts, nil
}

// Dial connects to Temporal with ClientOptions. A lazy client connects on first use, so
// the process starts (and serves its health endpoints) while Temporal is down; the worker
// dials eagerly, since it can do nothing without Temporal. With reg, the SDK's own metrics
// are exported there.
func (t *Temporal) Dial(p *Process, lazy bool, reg prometheus.Registerer) (client.Client, error) {
	opts, err := t.ClientOptions(p.Log)
	if err != nil {
		return nil, err
	}
	if reg != nil {
		if opts.MetricsHandler, err = telemetry.TemporalMetrics(reg); err != nil {
			return nil, err
		}
	}
	if lazy {
		return client.NewLazyClient(opts)
	}
	c, err := client.Dial(opts)
	if err != nil {
		return nil, fmt.Errorf("connect to Temporal at %s: %w", t.Address, err)
	}
	return c, nil
}

// Process is what Main sets up before a binary's own work.
type Process struct {
	// Log writes text to stderr, with trace IDs when a span is active.
	Log *slog.Logger
	// LogHandler is Log's handler, for libraries with loggers of their own.
	LogHandler slog.Handler
}

// NewMetrics returns a Prometheus registry with the Go runtime and process collectors, the
// start of every binary's /metrics.
func NewMetrics() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Main parses the flags registered so far, sets up logging and tracing, and runs the command
// until it returns or SIGINT/SIGTERM cancels ctx (a cancelled run that returns nil or
// context.Canceled is a clean exit; a second signal kills the process). It exits non-zero,
// naming the command, if run fails.
func Main(name string, run func(ctx context.Context, p *Process) error) {
	flag.Parse()
	if err := mainErr(name, run); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

func mainErr(name string, run func(ctx context.Context, p *Process) error) error {
	handler := telemetry.LogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p := &Process{Log: slog.New(handler), LogHandler: handler}
	stopTracing, err := telemetry.SetupTracing(context.Background(), "proxyfleet-"+name)
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	// Spans still buffered are flushed on the way out, failure or not.
	defer func() { _ = stopTracing(context.Background()) }()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal starts a graceful stop; restoring the default action then lets a
	// second one kill a process that is slow to stop, as controller-runtime's handler did.
	go func() { <-ctx.Done(); stop() }()
	err = run(ctx, p)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// ListVar defines a flag holding a comma-separated list; blanks around and between items
// are dropped, so "a, b," is [a b].
func ListVar(p *[]string, name, value, usage string) {
	*p = splitList(value)
	flag.Func(name, usage, func(s string) error {
		*p = splitList(s)
		return nil
	})
}

func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
