// Command worker runs ProxyWorkflow and its activities on the "proxies" task queue: it is
// the only process that talks to providers and the only writer of Proxy status.
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
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/gcp"
	kubeprovider "github.com/proxyfleet/proxyfleet/activities/provider/kubernetes"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/cmdline"
	"github.com/proxyfleet/proxyfleet/internal/schedules"
	"github.com/proxyfleet/proxyfleet/internal/telemetry"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/operator/controller"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

func main() { cmdline.Main("worker", run) }

func run() error {
	temporal := cmdline.TemporalFlags()
	var (
		taskQueue    = flag.String("task-queue", cmdline.Env("TASK_QUEUE", contract.TaskQueue), "task queue (env TASK_QUEUE)")
		installation = flag.String("installation", cmdline.Env("PROXYFLEET_INSTALLATION", "default"), "installation id put on every instance (env PROXYFLEET_INSTALLATION)")
		providers    = flag.String("providers", cmdline.Env("PROXYFLEET_PROVIDERS", "local,kubernetes"), "comma-separated providers to enable: gcp, kubernetes, local (env PROXYFLEET_PROVIDERS)")
		gcpProject   = flag.String("gcp-project", cmdline.Env("GOOGLE_CLOUD_PROJECT", ""), "default GCP project for the gcp provider; credentials come from Application Default Credentials (env GOOGLE_CLOUD_PROJECT)")
		localURL     = flag.String("local-daemon", cmdline.Env("LOCAL_DAEMON_URL", "http://127.0.0.1:8089"), "control API of localproxyd, for the local provider (env LOCAL_DAEMON_URL)")
		httpAddr     = flag.String("http-address", cmdline.Env("HTTP_ADDRESS", "127.0.0.1:9090"), "address of /metrics and /healthz (env HTTP_ADDRESS)")
		maxActs      = flag.Int("max-concurrent-activities", 4000, "activity slots; each proxy's monitor holds one for its whole life")
		gcEvery      = flag.Duration("gc-interval", 10*time.Minute, "how often the proxy-gc schedule sweeps orphaned instances (0 leaves the schedule alone)")
		gcMinAge     = flag.Duration("gc-min-age", 10*time.Minute, "instances younger than this are never swept")
		gcDryRun     = flag.Bool("gc-dry-run", false, "report orphans without deleting them")
		gcNamespaces = flag.String("gc-namespaces", "", "comma-separated namespaces the worker can see Proxies in (empty: all)")
		gcPartial    = flag.Bool("gc-allow-partial-view", false, "sweep even though --gc-namespaces limits the view (only if this installation's instances all belong to those namespaces)")
	)
	flag.Parse()
	log := slog.New(telemetry.LogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if !validInstallation(*installation) {
		return fmt.Errorf("--installation %q: use 1-63 lowercase letters, digits, '-' or '_'", *installation)
	}

	scheme := controller.NewScheme()
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes config: %w", err)
	}
	kube, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		return err
	}

	stopTracing, err := telemetry.SetupTracing(context.Background(), "proxyfleet-worker")
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	defer func() { _ = stopTracing(context.Background()) }()
	promReg := prometheus.NewRegistry()
	promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	sdkMetrics, err := telemetry.TemporalMetrics(promReg)
	if err != nil {
		return err
	}

	reg := provider.Registry{}
	for _, name := range strings.Split(*providers, ",") {
		switch v1alpha1.Provider(strings.TrimSpace(name)) {
		case v1alpha1.ProviderLocal:
			reg[v1alpha1.ProviderLocal] = local.NewProvider(*localURL)
		case v1alpha1.ProviderGCP:
			if *gcpProject == "" {
				return fmt.Errorf("the gcp provider needs --gcp-project")
			}
			g, err := gcp.New(context.Background(), gcp.Config{DefaultProject: *gcpProject})
			if err != nil {
				return err
			}
			defer g.Close()
			reg[v1alpha1.ProviderGCP] = g
		case v1alpha1.ProviderKubernetes:
			reg[v1alpha1.ProviderKubernetes] = &kubeprovider.Provider{Client: kube}
		case "":
		default:
			return fmt.Errorf("--providers: %q is not available in this build", name)
		}
	}

	reg = provider.InstrumentAll(reg, provider.NewMetrics(promReg))
	copts, err := temporal.ClientOptions(log)
	if err != nil {
		return err
	}
	copts.MetricsHandler = sdkMetrics
	c, err := client.Dial(copts)
	if err != nil {
		return fmt.Errorf("connect to Temporal at %s: %w", temporal.Address, err)
	}
	defer c.Close()

	opts := workflows.WorkerOptions()
	opts.MaxConcurrentActivityExecutionSize = *maxActs
	w := worker.New(c, *taskQueue, opts)
	w.RegisterWorkflow(workflows.ProxyWorkflow)
	w.RegisterWorkflow(workflows.GCWorkflow)
	w.RegisterActivity(&activities.Activities{Providers: reg, Kube: kube, Installation: *installation, Temporal: c,
		Metrics: activities.NewMetrics(promReg), Log: log})

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(promReg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return fmt.Errorf("--http-address: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	if err := w.Start(); err != nil {
		return err
	}
	if *gcEvery > 0 {
		var names []v1alpha1.Provider
		for name := range reg {
			names = append(names, name)
		}
		slices.Sort(names)
		var nss []string
		for _, ns := range strings.Split(*gcNamespaces, ",") {
			if ns = strings.TrimSpace(ns); ns != "" {
				nss = append(nss, ns)
			}
		}
		err := schedules.EnsureGC(ctx, c.ScheduleClient(), schedules.GCOptions{Every: *gcEvery, TaskQueue: *taskQueue,
			Input: workflows.GCInput{Installation: *installation, Providers: names, MinAge: *gcMinAge, DryRun: *gcDryRun,
				Namespaces: nss, AllowPartialView: *gcPartial}})
		if err != nil {
			return fmt.Errorf("create or update the %s schedule: %w", contract.GCScheduleID, err)
		}
	}
	log.Info("worker started", "taskQueue", *taskQueue, "providers", *providers, "installation", *installation, "http", ln.Addr().String())
	<-ctx.Done()
	w.Stop()
	if errors.Is(ctx.Err(), context.Canceled) {
		return nil
	}
	return ctx.Err()
}

func validInstallation(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}
