// Command operator runs the thin controller: it watches Proxy objects (and cloud-init
// Secrets) and hands each change to the Proxy's workflow in Temporal.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/go-logr/logr"
	"go.temporal.io/sdk/client"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/proxyfleet/proxyfleet/internal/cmdline"
	"github.com/proxyfleet/proxyfleet/internal/telemetry"
	"github.com/proxyfleet/proxyfleet/operator/controller"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

func main() { cmdline.Main("operator", run) }

func run() error {
	temporal := cmdline.TemporalFlags()
	var (
		taskQueue    = flag.String("task-queue", cmdline.Env("TASK_QUEUE", contract.TaskQueue), "task queue of the workflows it starts (env TASK_QUEUE)")
		installation = flag.String("installation", cmdline.Env("PROXYFLEET_INSTALLATION", "default"), "installation id handed to new workflows (env PROXYFLEET_INSTALLATION)")
		metricsAddr  = flag.String("metrics-bind-address", "127.0.0.1:8080", "address of /metrics")
		probeAddr    = flag.String("health-probe-bind-address", "127.0.0.1:8081", "address of /healthz and /readyz")
		leaderElect  = flag.Bool("leader-elect", false, "elect a leader, so only one replica reconciles")
		leNamespace  = flag.String("leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's)")
	)
	tuning := tuningFlags(flag.CommandLine)
	flag.Parse()
	handler := telemetry.LogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	log := slog.New(handler)
	ctrl.SetLogger(logr.FromSlogHandler(handler))

	scheme := controller.NewScheme()
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes config: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controller.CacheOptions(),
		Metrics:                 metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:  *probeAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "proxyfleet-operator",
		LeaderElectionNamespace: *leNamespace,
	})
	if err != nil {
		return err
	}
	stopTracing, err := telemetry.SetupTracing(context.Background(), "proxyfleet-operator")
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	defer func() { _ = stopTracing(context.Background()) }()
	opts, err := temporal.ClientOptions(log)
	if err != nil {
		return err
	}
	// Lazy: the operator starts while Temporal is down; reconciles retry until it is back.
	tc, err := client.NewLazyClient(opts)
	if err != nil {
		return err
	}
	defer tc.Close()
	ctx := ctrl.SetupSignalHandler()
	r := &controller.ProxyReconciler{
		Client: mgr.GetClient(), Temporal: tc, Events: mgr.GetEventRecorder("proxyfleet-operator"),
		Installation: *installation, TaskQueue: *taskQueue, Tuning: *tuning,
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	ctrlmetrics.Registry.MustRegister(controller.ProxyCollector{Reader: mgr.GetClient()})
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	log.Info("operator starting", "temporal", temporal.Address, "taskQueue", *taskQueue, "leaderElect", *leaderElect)
	return mgr.Start(ctx)
}

// tuningFlags registers the workflow timings. They are handed to workflows the operator
// starts (a running workflow keeps its own); 0 keeps the default. Shorter timings recover
// faster from a dead worker at the price of more Temporal traffic; fault tests use them.
func tuningFlags(fs *flag.FlagSet) *workflows.Tuning {
	t := &workflows.Tuning{}
	def := workflows.Tuning{}.WithDefaults()
	for _, f := range []struct {
		name string
		v    *time.Duration
		d    time.Duration
		help string
	}{
		{"tuning-poll-interval", &t.PollInterval, def.PollInterval, "how often activities ask the provider about an instance"},
		{"tuning-retry-base", &t.RetryBase, def.RetryBase, "first backoff after a failure that outlived an activity's retries"},
		{"tuning-retry-max", &t.RetryMax, def.RetryMax, "longest such backoff"},
		{"tuning-quota-retry", &t.QuotaRetry, def.QuotaRetry, "wait after a quota refusal"},
		{"tuning-activity-timeout", &t.ActivityTimeout, def.ActivityTimeout, "bound of one provider call; a worker that dies mid-call is noticed after this long"},
		{"tuning-heartbeat-timeout", &t.HeartbeatTimeout, def.HeartbeatTimeout, "how soon a dead worker's long activities move to another worker"},
		{"tuning-wait-running-max", &t.WaitRunningMax, def.WaitRunningMax, "bound of one wait for an instance to run"},
		{"tuning-drift-interval", &t.DriftInterval, def.DriftInterval, "how often the monitor checks that the instance still exists"},
	} {
		fs.DurationVar(f.v, f.name, 0, fmt.Sprintf("%s (0: %s)", f.help, f.d))
	}
	return t
}
