// Package worker wires the worker process: the providers, the activities, the Temporal
// worker that hosts ProxyWorkflow and GCWorkflow, and the orphan-sweep schedule. cmd/worker
// runs it with Run; the test stack builds the same Worker with New, so tests exercise the
// wiring production runs.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/registry"
	"github.com/proxyfleet/proxyfleet/internal/cmdline"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/internal/schedules"
	"github.com/proxyfleet/proxyfleet/operator/api"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// DefaultMaxConcurrentActivities is a worker's activity slots unless told otherwise. A
// proxy whose workflow still runs a Monitor activity of its own (version 3 and older, until
// the run continues as new) holds a slot for its whole life, so the SDK's default (1,000)
// could leave the 1,001st such proxy unwatched during an upgrade; tests run with this
// default too, so their fleets see the worker production runs.
const DefaultMaxConcurrentActivities = 4000

// DefaultMonitorShards is how many monitor shards watch a task queue's proxies unless told
// otherwise. Each costs one heartbeat every 32 s whatever it watches, and a shard's members
// run on whichever worker holds it: 4 spreads the probing of a fleet over up to 4 workers
// for ~330,000 actions a month in all.
const DefaultMonitorShards = 4

// DefaultShardLiveness is Config.ShardLiveness's default. A live worker polls each task
// queue at least once a long poll (about a minute) even when idle; a worker gone for longer
// than this no longer decides the shard count.
const DefaultShardLiveness = 3 * time.Minute

// MaxMonitorShards bounds --monitor-shards, and what a poller's identity may claim: each
// shard is a workflow and a long activity, and a typo or a stray identity must not make
// every worker start a million of them.
const MaxMonitorShards = 1024

// shardClockSkew is how far ahead of the reader's clock a poller's start may be and still
// count: workers' clocks differ a little; a start far in the future (a clock badly wrong,
// an identity made up) would otherwise win every decision for as long as it polls.
const shardClockSkew = 5 * time.Minute

// Config is everything the worker is told, from flags or a test.
type Config struct {
	// TaskQueue defaults to contract.TaskQueue.
	TaskQueue string
	// Installation is this deployment's id, put on every instance as an ownership label.
	Installation string
	// Providers says which providers to enable; New fills in its Kube client and metrics.
	Providers registry.Config
	// MaxConcurrentActivities bounds activity slots (0: DefaultMaxConcurrentActivities).
	// Each proxy's monitor holds one for its whole life.
	MaxConcurrentActivities int
	// GC configures the proxy-gc schedule.
	GC GCConfig
	// MonitorShards is how many monitor shards (MonitorShardWorkflow) the worker keeps
	// running (0: DefaultMonitorShards). They watch every proxy of the task queue. Every
	// worker of a task queue must be given the same count: a worker that starts retires
	// the shards of any other count.
	MonitorShards int
	// ShardCheckEvery is how often the worker checks that every monitor shard of its count
	// runs, and starts one that does not (someone terminated it): 0 is a minute. Each
	// check is one DescribeWorkflowExecution per shard, which Temporal does not bill.
	ShardCheckEvery time.Duration
	// MonitorRefresh is how often a shard reads what changed in its membership (0: the
	// activity's default). It is given to shards when they start; running ones keep theirs.
	MonitorRefresh time.Duration
	// ShardLiveness is how recently a worker must have polled the task queue to count when
	// workers of different shard counts decide whose count runs (0: DefaultShardLiveness).
	ShardLiveness time.Duration
	// Keyring is the fleet key shared with discovery: Managed instances' credentials are
	// derived from it, External ones sealed with it.
	Keyring *proxyauth.Keyring
}

// GCConfig configures the orphan-sweep schedule the worker creates or updates at start.
type GCConfig struct {
	// Every is the sweep interval; 0 leaves the schedule alone.
	Every time.Duration
	// MinAge spares younger instances (0: workflows.DefaultGCMinAge).
	MinAge time.Duration
	// DryRun reports orphans without deleting them.
	DryRun bool
	// Namespaces, when set, are the only namespaces the worker can see Proxies in; the
	// sweep then refuses to run unless AllowPartialView is set.
	Namespaces       []string
	AllowPartialView bool
}

// Worker is a configured Temporal worker, not yet started.
type Worker struct {
	cfg        Config
	temporal   client.Client
	activities *activities.Activities
	sdk        sdkworker.Worker
	log        *slog.Logger
	stop       sync.Once
	release    func()
	// cancel stops the shard check Start began; done is closed when it has stopped.
	cancel context.CancelFunc
	done   chan struct{}
	// started is when New ran, as the worker's poller identity tells other workers;
	// keptCount is the shard count the last check kept (a newer worker's, or ours), see
	// ensureShards.
	started   time.Time
	keptCount int
}

// New builds the worker: the providers cfg enables, the activities over them, and a
// Temporal worker on cfg.TaskQueue with every workflow and activity registered. Metrics go
// to reg when it is not nil. Stop releases what New acquired.
func New(ctx context.Context, cfg Config, tc client.Client, kube ctrlclient.Client, log *slog.Logger, reg prometheus.Registerer) (*Worker, error) {
	if err := ValidateInstallation(cfg.Installation); err != nil {
		return nil, fmt.Errorf("installation %w", err)
	}
	if cfg.TaskQueue == "" {
		cfg.TaskQueue = contract.TaskQueue
	}
	if cfg.MonitorShards < 0 || cfg.MonitorShards > MaxMonitorShards {
		return nil, fmt.Errorf("monitor shards must be from 1 to %d, not %d", MaxMonitorShards, cfg.MonitorShards)
	}
	cfg.MonitorShards = cmp.Or(cfg.MonitorShards, DefaultMonitorShards)
	pcfg := cfg.Providers
	pcfg.Kube = kube
	if pcfg.GCP.Logger == nil {
		pcfg.GCP.Logger = log // what Get repairs (a shared firewall rule) goes to the worker's log
	}
	if pcfg.AWS.Logger == nil {
		pcfg.AWS.Logger = log // the same for a shared security group
	}
	var actMetrics *activities.Metrics
	if reg != nil {
		pcfg.Metrics = provider.NewMetrics(reg)
		actMetrics = activities.NewMetrics(reg)
	}
	// Clients built here outlive ctx's cancellation: activities still draining during Stop
	// may need them (the GCP client refreshes its token with this context).
	providers, release, err := registry.Build(context.WithoutCancel(ctx), pcfg)
	if err != nil {
		return nil, err
	}
	acts := &activities.Activities{Providers: providers, Kube: kube, Installation: cfg.Installation,
		Temporal: tc, Signaller: tc, Metrics: actMetrics, Log: log, Keyring: cfg.Keyring}
	opts := workflows.WorkerOptions()
	opts.MaxConcurrentActivityExecutionSize = cmp.Or(cfg.MaxConcurrentActivities, DefaultMaxConcurrentActivities)
	started := time.Now()
	// The identity every poll carries says this worker's shard count and start, so the
	// workers of a queue can agree on one count from who is polling (ensureShards).
	opts.Identity = shardIdentity(defaultIdentity(), cfg.MonitorShards, started)
	w := sdkworker.New(tc, cfg.TaskQueue, opts)
	workflows.Register(w, acts)
	return &Worker{cfg: cfg, temporal: tc, activities: acts, sdk: w, log: log, release: release, started: started}, nil
}

// Start starts polling, makes sure the monitor shards run, then
// creates or updates the proxy-gc schedule (when GC.Every is set).
func (w *Worker) Start(ctx context.Context) error {
	if err := w.sdk.Start(); err != nil {
		return err
	}
	if err := w.ensureShards(ctx); err != nil {
		return fmt.Errorf("start the monitor shards: %w", err)
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.cancel, w.done = cancel, make(chan struct{})
	go w.keepShards(kctx)
	if w.cfg.GC.Every <= 0 {
		return nil
	}
	in := workflows.GCInput{Installation: w.cfg.Installation, Providers: slices.Sorted(maps.Keys(w.activities.Providers)),
		MinAge: w.cfg.GC.MinAge, DryRun: w.cfg.GC.DryRun, Namespaces: w.cfg.GC.Namespaces, AllowPartialView: w.cfg.GC.AllowPartialView}
	err := schedules.EnsureGC(ctx, w.temporal.ScheduleClient(), schedules.GCOptions{Every: w.cfg.GC.Every, TaskQueue: w.cfg.TaskQueue, Input: in})
	if err != nil {
		return fmt.Errorf("create or update the %s schedule: %w", contract.GCScheduleID, err)
	}
	return nil
}

// ensureShards keeps the monitor shards of one count running on the task queue: it starts
// each shard of its count that is not running (asking costs one DescribeWorkflowExecution,
// which Temporal does not bill) and terminates the shards of any other count, which would
// watch the same proxies twice.
//
// Workers of one queue can disagree on the count for as long as a rollout that changes
// --monitor-shards takes. Each terminating the other's shards every check would reset
// every watch every minute, so they agree on one: the count of the newest worker still
// polling the queue, read from the pollers' identities (liveCount). Every worker reads the
// same pollers, so every worker picks the same count; a worker of the old count that
// restarts mid-rollout is the newest for as long as it lives, and once it is gone the
// workers that remain go back to theirs. A worker keeps the chosen count's set whole (it
// starts a missing shard of it too). Where the pollers cannot be read, the count of shards
// started after this worker started is taken instead (newerCount).
func (w *Worker) ensureShards(ctx context.Context) error {
	running, err := w.runningShards(ctx)
	if err != nil {
		return err
	}
	n := w.cfg.MonitorShards
	m, ok := w.liveCount(ctx)
	if !ok {
		m, ok = newerCount(running, n, w.started)
	}
	if ok && m != n {
		if w.keptCount != m {
			w.log.Info("a worker started since runs the monitor shards with another count; keeping that count", "theirs", m, "ours", n)
		}
		n = m
	}
	w.keptCount = n
	for k := range n {
		id := contract.MonitorShardWorkflowID(w.cfg.TaskQueue, k, n)
		if _, ok := running[id]; ok {
			continue
		}
		// Visibility lags: a shard started a moment ago may not be listed yet. Describe
		// (not billed) tells a running one from one that ended.
		desc, err := w.temporal.DescribeWorkflow(ctx, id, "")
		var notFound *serviceerror.NotFound
		switch {
		case err == nil && desc.RawResponse.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING:
			continue
		case err != nil && !errors.As(err, &notFound):
			return fmt.Errorf("%s: %w", id, err)
		}
		if w.done != nil {
			// Not at start: a shard that ended is news.
			w.log.Warn("a monitor shard was not running; starting it again", "shard", id)
		}
		if err := w.startShard(ctx, k, n); err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
	}
	for id, sh := range running {
		if sh.count == n {
			continue
		}
		err := w.temporal.TerminateWorkflow(ctx, id, "", fmt.Sprintf("monitor shards are now %d", n))
		var notFound *serviceerror.NotFound
		if err != nil && !errors.As(err, &notFound) {
			return fmt.Errorf("retire %s: %w", id, err)
		}
	}
	return nil
}

// runningShard is a monitor shard listed as running.
type runningShard struct {
	index, count int
	started      time.Time
}

// runningShards lists the monitor shards running on the worker's task queue, by ID.
func (w *Worker) runningShards(ctx context.Context) (map[string]runningShard, error) {
	out := map[string]runningShard{}
	var token []byte
	for {
		resp, err := w.temporal.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Query: contract.OnTaskQueue(fmt.Sprintf("WorkflowType = %q AND ExecutionStatus = 'Running'", contract.MonitorShardWorkflowType),
				w.cfg.TaskQueue),
			NextPageToken: token,
		})
		if err != nil {
			return nil, fmt.Errorf("list monitor shards: %w", err)
		}
		for _, ex := range resp.GetExecutions() {
			id := ex.GetExecution().GetWorkflowId()
			var sh runningShard
			if _, err := fmt.Sscanf(id[strings.LastIndexByte(id, '/')+1:], "%d-of-%d", &sh.index, &sh.count); err != nil {
				continue // not a name this code gives; a shard is only ever retired by its name
			}
			sh.started = ex.GetStartTime().AsTime()
			out[id] = sh
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			break
		}
	}
	return out, nil
}

// liveCount is the shard count of the newest worker polling the task queue within
// ShardLiveness, this one included; false if the pollers cannot be read.
func (w *Worker) liveCount(ctx context.Context) (int, bool) {
	resp, err := w.temporal.DescribeTaskQueue(ctx, w.cfg.TaskQueue, enumspb.TASK_QUEUE_TYPE_WORKFLOW)
	if err != nil {
		w.log.Debug("reading the task queue's pollers failed; judging the shard count by the running shards", "error", err)
		return 0, false
	}
	return newestLive(resp.GetPollers(), shardPoller{count: w.cfg.MonitorShards, started: w.started},
		time.Now(), cmp.Or(w.cfg.ShardLiveness, DefaultShardLiveness)), true
}

// shardPoller is what a worker's identity says: its shard count and when it started.
type shardPoller struct {
	count   int
	started time.Time
}

// newestLive is the count of the newest of self and the pollers seen within liveness. An
// identity without the shard fields (a worker of an older build, the CLI) has no say. On a
// tie the larger count wins, so every worker breaks it the same way.
func newestLive(pollers []*taskqueuepb.PollerInfo, self shardPoller, now time.Time, liveness time.Duration) int {
	best := self
	for _, p := range pollers {
		sp, ok := parseShardIdentity(p.GetIdentity())
		if !ok || p.GetLastAccessTime() == nil || now.Sub(p.GetLastAccessTime().AsTime()) > liveness ||
			sp.started.After(now.Add(shardClockSkew)) {
			continue
		}
		if sp.started.After(best.started) || sp.started.Equal(best.started) && sp.count > best.count {
			best = sp
		}
	}
	return best.count
}

// The fields a worker's identity ends with, after the SDK's usual pid@host.
const (
	identityShards  = "@shards="
	identityStarted = "@started="
)

// defaultIdentity is the SDK's own form of an identity: pid@host.
func defaultIdentity() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%d@%s", os.Getpid(), host)
}

func shardIdentity(base string, count int, started time.Time) string {
	return fmt.Sprintf("%s%s%d%s%d", base, identityShards, count, identityStarted, started.UnixNano())
}

func parseShardIdentity(id string) (shardPoller, bool) {
	i := strings.LastIndex(id, identityShards)
	if i < 0 {
		return shardPoller{}, false
	}
	var count int
	var nanos int64
	if _, err := fmt.Sscanf(id[i:], identityShards+"%d"+identityStarted+"%d", &count, &nanos); err != nil || count < 1 || count > MaxMonitorShards {
		return shardPoller{}, false
	}
	return shardPoller{count: count, started: time.Unix(0, nanos)}, true
}

// newerCount reports the count of the shards, other than ours, started most recently
// after since: those of a worker that started after this one.
func newerCount(running map[string]runningShard, ours int, since time.Time) (int, bool) {
	best, bestAt := 0, since
	for _, sh := range running {
		if sh.count != ours && sh.started.After(bestAt) {
			best, bestAt = sh.count, sh.started
		}
	}
	return best, best != 0
}

// keepShards runs ensureShards every ShardCheckEvery: a shard terminated by hand (or by a
// server limit) would otherwise leave its proxies unwatched until a worker restarts, and
// the shards of an old count, left running by the workers of a rollout that changed
// --monitor-shards, would watch their proxies twice.
func (w *Worker) keepShards(ctx context.Context) {
	defer close(w.done)
	t := time.NewTicker(cmp.Or(w.cfg.ShardCheckEvery, time.Minute))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := w.ensureShards(ctx); err != nil && ctx.Err() == nil {
			w.log.Warn("checking the monitor shards failed; trying again later", "error", err)
		}
	}
}

// startShard starts shard k of n, or leaves the running one as it is.
func (w *Worker) startShard(ctx context.Context, k, n int) error {
	_, err := w.temporal.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: contract.MonitorShardWorkflowID(w.cfg.TaskQueue, k, n), TaskQueue: w.cfg.TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		StaticSummary:            fmt.Sprintf("monitor shard %d of %d", k, n),
	}, contract.MonitorShardWorkflowType, activities.ShardInput{Index: k, Count: n, Refresh: w.cfg.MonitorRefresh})
	return err
}

// Stop stops polling, waits for running activities to return, and releases the providers.
// It is safe to call more than once, and after a Start that failed.
func (w *Worker) Stop() {
	w.stop.Do(func() {
		if w.cancel != nil {
			w.cancel()
			<-w.done
		}
		w.sdk.Stop()
		w.release()
	})
}

// ValidateInstallation checks an installation id: it becomes a label value on GCP and in
// Kubernetes, and the orphan sweep trusts it, so it must be a valid, non-empty one. The
// error names the value, for the caller to say where it came from.
func ValidateInstallation(s string) error {
	ok := s != "" && len(s) <= 63
	for _, r := range s {
		ok = ok && (r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	}
	if !ok {
		return fmt.Errorf("%q: use 1-63 lowercase letters, digits, '-' or '_'", s)
	}
	return nil
}

// Run is the worker process: it connects to Kubernetes (in-cluster or kubeconfig) and
// Temporal, serves /metrics and /healthz on httpAddr, and runs the worker until ctx ends.
func Run(ctx context.Context, p *cmdline.Process, tf *cmdline.Temporal, cfg Config, httpAddr string) error {
	// A bad flag is reported before anything is dialled.
	if err := ValidateInstallation(cfg.Installation); err != nil {
		return fmt.Errorf("--installation %w", err)
	}
	kcfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes config: %w", err)
	}
	// Not a cached client: Secrets are read once per use and never kept.
	kube, err := ctrlclient.New(kcfg, ctrlclient.Options{Scheme: api.NewScheme()})
	if err != nil {
		return err
	}
	reg := cmdline.NewMetrics()
	tc, err := tf.Dial(p, false, reg)
	if err != nil {
		return err
	}
	defer tc.Close()
	w, err := New(ctx, cfg, tc, kube, p.Log, reg)
	if err != nil {
		return err
	}
	defer w.Stop()

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	ln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return fmt.Errorf("--http-address: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	if err := w.Start(ctx); err != nil {
		return err
	}
	p.Log.Info("worker started", "taskQueue", w.cfg.TaskQueue, "providers", registry.Join(cfg.Providers.Enabled),
		"installation", cfg.Installation, "http", ln.Addr().String())
	<-ctx.Done()
	return nil
}
