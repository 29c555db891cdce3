package controller

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/proxyfleet/proxyfleet/operator/api"
	"github.com/proxyfleet/proxyfleet/workflows/proxyinput"
)

// Options configure the operator process.
type Options struct {
	// Installation, TaskQueue and Tuning are handed to the workflows the controller starts.
	Installation string
	TaskQueue    string
	Tuning       proxyinput.Tuning
	// MetricsAddress serves /metrics; HealthProbeAddress serves /healthz and /readyz.
	MetricsAddress, HealthProbeAddress string
	// LeaderElection lets only one replica reconcile, through a Lease named
	// "proxyfleet-operator" in LeaderElectionNamespace (default: the pod's).
	LeaderElection          bool
	LeaderElectionNamespace string
	// RecheckDeleting is ProxyReconciler.RecheckDeleting (0: its default); tests shorten it.
	RecheckDeleting time.Duration
	// ResyncInterval is how often the elected leader looks for live Proxies whose workflow
	// stopped and starts it again (ProxyReconciler.Resync). 0 is DefaultResyncInterval; a
	// negative value turns the resync off.
	ResyncInterval time.Duration
	// Discovery is read for pools' demand by the autoscaler (nil: pools with
	// spec.autoscale keep their size, and say why) and for their proxies' leases and rests
	// when a pool shrinks (nil: the least useful go first without them);
	// AutoscaleInterval is how often the autoscaler looks (0: DefaultAutoscaleInterval).
	Discovery         Discovery
	AutoscaleInterval time.Duration
}

// Setup adds the Proxy and ProxyPool controllers, the pools' autoscaler, and the periodic
// resync that restarts stopped workflows, to mgr, talking to Temporal through tc. The operator process (Run) and the test stack both
// set it up here, in managers of their own.
func Setup(ctx context.Context, mgr manager.Manager, tc Temporal, opts Options) error {
	r := &ProxyReconciler{
		Client: mgr.GetClient(), Temporal: tc, Events: mgr.GetEventRecorder("proxyfleet-operator"),
		Installation: opts.Installation, TaskQueue: opts.TaskQueue, Tuning: opts.Tuning,
		RecheckDeleting: opts.RecheckDeleting, APIReader: mgr.GetAPIReader(),
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	pools := &PoolReconciler{Client: mgr.GetClient(), Events: mgr.GetEventRecorder("proxyfleet-operator"), Discovery: opts.Discovery, Temporal: tc}
	if err := pools.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := mgr.Add(&Autoscaler{Client: mgr.GetClient(), Events: mgr.GetEventRecorder("proxyfleet-operator"),
		Demand: opts.Discovery, Interval: opts.AutoscaleInterval}); err != nil {
		return err
	}
	interval := opts.ResyncInterval
	if interval < 0 {
		return nil
	}
	if interval == 0 {
		interval = DefaultResyncInterval
	}
	return mgr.Add(&resyncRunnable{r: r, interval: interval, log: mgr.GetLogger().WithName("resync")})
}

// Run is the operator process: it connects to Kubernetes (in-cluster or kubeconfig) and
// runs the controller in a controller-runtime manager until ctx ends. tc may be a lazy
// client: reconciles that cannot reach Temporal retry until it is back.
func Run(ctx context.Context, opts Options, tc Temporal, logs slog.Handler) error {
	ctrl.SetLogger(logr.FromSlogHandler(logs))
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes config: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  api.NewScheme(),
		Cache:                   CacheOptions(),
		Metrics:                 metricsserver.Options{BindAddress: opts.MetricsAddress},
		HealthProbeBindAddress:  opts.HealthProbeAddress,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        "proxyfleet-operator",
		LeaderElectionNamespace: opts.LeaderElectionNamespace,
	})
	if err != nil {
		return err
	}
	if err := Setup(ctx, mgr, tc, opts); err != nil {
		return err
	}
	// The process-wide registry is the manager's /metrics; one operator per process.
	ctrlmetrics.Registry.MustRegister(ProxyCollector{Reader: mgr.GetClient()}, workflowRestarts)
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	return mgr.Start(ctx)
}
