// Command worker hosts ProxyWorkflow, GCWorkflow and their activities on the task queue
// (default "proxies"), and keeps the proxy-gc schedule in step with its flags. It is the
// only process that talks to providers and the only writer of Proxy status.
package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/proxyfleet/proxyfleet/activities/provider/registry"
	"github.com/proxyfleet/proxyfleet/internal/cmdline"
	"github.com/proxyfleet/proxyfleet/internal/worker"
	"github.com/proxyfleet/proxyfleet/workflows"
)

func main() {
	temporal := cmdline.TemporalFlags()
	var cfg worker.Config
	cmdline.TaskQueueVar(&cfg.TaskQueue, "task queue")
	cmdline.InstallationVar(&cfg.Installation, "installation id put on every instance")
	providers := flag.String("providers", cmdline.Env("PROXYFLEET_PROVIDERS", "local,kubernetes"), "comma-separated providers to enable: "+registry.Join(registry.Available)+" (env PROXYFLEET_PROVIDERS)")
	flag.StringVar(&cfg.Providers.GCP.DefaultProject, "gcp-project", cmdline.Env("GOOGLE_CLOUD_PROJECT", ""), "default GCP project for the gcp provider; credentials come from Application Default Credentials (env GOOGLE_CLOUD_PROJECT)")
	flag.StringVar(&cfg.Providers.LocalDaemonURL, "local-daemon", cmdline.Env("LOCAL_DAEMON_URL", "http://127.0.0.1:8089"), "control API of localproxyd, for the local provider (env LOCAL_DAEMON_URL)")
	httpAddr := flag.String("http-address", cmdline.Env("HTTP_ADDRESS", "127.0.0.1:9090"), "address of /metrics and /healthz (env HTTP_ADDRESS)")
	flag.IntVar(&cfg.MaxConcurrentActivities, "max-concurrent-activities", 4000, "activity slots; each proxy's monitor holds one for its whole life")
	flag.DurationVar(&cfg.GC.Every, "gc-interval", workflows.DefaultGCInterval, "how often the proxy-gc schedule sweeps orphaned instances (0 leaves the schedule alone)")
	flag.DurationVar(&cfg.GC.MinAge, "gc-min-age", workflows.DefaultGCMinAge, "instances younger than this are never swept (0: the default)")
	flag.BoolVar(&cfg.GC.DryRun, "gc-dry-run", false, "report orphans without deleting them")
	cmdline.ListVar(&cfg.GC.Namespaces, "gc-namespaces", "", "comma-separated namespaces the worker can see Proxies in (empty: all)")
	flag.BoolVar(&cfg.GC.AllowPartialView, "gc-allow-partial-view", false, "sweep even though --gc-namespaces limits the view (only if this installation's instances all belong to those namespaces)")

	fleetKey := cmdline.FleetKeyVar()

	cmdline.Main("worker", func(ctx context.Context, p *cmdline.Process) error {
		var err error
		if cfg.Providers.Enabled, err = registry.ParseNames(*providers); err != nil {
			return fmt.Errorf("--providers: %w", err)
		}
		if cfg.Keyring, err = fleetKey(); err != nil {
			return err
		}
		return worker.Run(ctx, p, temporal, cfg, *httpAddr)
	})
}
