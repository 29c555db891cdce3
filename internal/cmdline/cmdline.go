// Package cmdline holds what every binary's main shares: flags that default from the
// environment, the Temporal connection flags, and how a command exits on error. Keeping
// them in one place keeps flag names, env names and help text the same across binaries
// (deploy/ and docker-compose.yaml are tested against them).
package cmdline

import (
	"flag"
	"fmt"
	"log/slog"
	"os"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	tlog "go.temporal.io/sdk/log"

	"github.com/proxyfleet/proxyfleet/internal/telemetry"
)

// Env returns the environment variable key, or def when it is unset or empty.
func Env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Temporal are the flags that locate the Temporal server.
type Temporal struct {
	Address, Namespace string
}

// TemporalFlags registers --temporal-address and --temporal-namespace.
func TemporalFlags() *Temporal {
	t := &Temporal{}
	flag.StringVar(&t.Address, "temporal-address", Env("TEMPORAL_ADDRESS", "127.0.0.1:7233"), "Temporal frontend host:port (env TEMPORAL_ADDRESS)")
	flag.StringVar(&t.Namespace, "temporal-namespace", Env("TEMPORAL_NAMESPACE", "default"), "Temporal namespace (env TEMPORAL_NAMESPACE)")
	return t
}

// ClientOptions are the Temporal client options every binary starts from: these flags, the
// process's logger, and the tracing interceptor (it traces nothing unless OTEL_* variables
// set tracing up).
func (t *Temporal) ClientOptions(log *slog.Logger) (client.Options, error) {
	tracing, err := telemetry.TemporalInterceptor()
	if err != nil {
		return client.Options{}, err
	}
	return client.Options{
		HostPort: t.Address, Namespace: t.Namespace,
		Logger:       tlog.NewStructuredLogger(log),
		Interceptors: []interceptor.ClientInterceptor{tracing},
	}, nil
}

// Main runs the command and exits non-zero, naming it, if it fails.
func Main(name string, run func() error) {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}
