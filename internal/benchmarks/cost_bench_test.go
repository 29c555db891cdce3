// What a fleet at rest costs Temporal: BenchmarkIdleFleetCost reports the billable actions
// the dev server counts per proxy per hour and per month, the workflow tasks, history
// events and the dev server's CPU of 1,000 idle Proxies (IDLE_FLEET), against the same
// system with no Proxy, and what discovery's index of that fleet costs. Feeds the tables of
// "What an idle fleet costs Temporal" in docs/benchmarks.md (under ## Steady state): the
// per-proxy figures, the runs of the day, and the 5,000-proxy table.

package benchmarks

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/temporal"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/worker"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// hoursPerMonth is what "per month" means in the figures: 365 × 24 / 12.
const hoursPerMonth = 730

// BenchmarkIdleFleetCost measures what a healthy fleet at rest costs Temporal: the billable
// actions the server itself counts (its `action` counter, by kind) per proxy per hour and
// per month, the workflow tasks it ran, the history events written, and the dev server's
// CPU, over a window in which nobody leases and nothing changes. The Proxies take the
// default health check (10 s probes) and the workflows production's timings, so the figure
// is what a user's idle fleet costs. Its baseline, in the same run, is the system with no
// Proxy at all (worker, monitor shards, discovery's absence) over IDLE_BASELINE (1m): what
// the fleet adds is the difference. IDLE_FLEET (1,000) and IDLE_WINDOW (5m) override.
//
//	go test ./internal/benchmarks -run '^$' -bench IdleFleetCost -benchtime 1x -timeout 60m
func BenchmarkIdleFleetCost(b *testing.B) {
	n, window := envInt(b, "IDLE_FLEET", 1000), envDuration(b, "IDLE_WINDOW", 5*time.Minute)
	// Production timings, except how often creation is polled (which only speeds the
	// fleet to Ready; nothing polls at rest).
	s := stack.Start(b, stack.Options{Tuning: workflows.Tuning{PollInterval: 100 * time.Millisecond}, NoWorker: true})
	ctx := context.Background()
	ns := s.Namespace(b)
	// The stack's worker, except that it leaves its shards alone once started (the last
	// window stops them) and reads membership every IDLE_SHARD_REFRESH if set.
	reg := prometheus.NewRegistry()
	w := s.NewWorkerWithMetrics(b, s.TaskQueue, reg, func(c *worker.Config) {
		c.ShardCheckEvery = 24 * time.Hour
		c.MonitorRefresh = envDuration(b, "IDLE_SHARD_REFRESH", 0)
	})
	b.Cleanup(w.Stop)
	require.NoError(b, w.Start(ctx))
	// Let the shards start and send their first heartbeats before the baseline.
	time.Sleep(workflows.ShardHeartbeatTimeout)

	// The baseline: the same system with nothing to watch.
	baseWindow := envDuration(b, "IDLE_BASELINE", time.Minute)
	e0, err := s.Temporal.Actions(ctx, s.Temporal.Namespace)
	require.NoError(b, err)
	ecpu0, et0 := takeCPUSample(), time.Now()
	time.Sleep(baseWindow) // the measurement window itself, not synchronisation
	ecpu1, eElapsed := takeCPUSample(), time.Since(et0)
	time.Sleep(2 * time.Second) // one more flush of the server's counters
	e1, err := s.Temporal.Actions(ctx, s.Temporal.Namespace)
	require.NoError(b, err)
	emptyCores := ecpu1.since(ecpu0)["temporal"].Seconds() / eElapsed.Seconds()
	emptyActions := 0.0
	for k := range e1 {
		if k != "workflow_tasks_completed" {
			emptyActions += e1[k] - e0[k]
		}
	}
	b.Logf("baseline, no Proxy, over %s: %.0f actions per hour in all (the monitor shards' heartbeats), dev server %.3f cores",
		eElapsed.Round(time.Second), emptyActions/eElapsed.Hours(), emptyCores)
	b.ReportMetric(emptyActions/eElapsed.Hours(), "empty-actions/hour")
	b.ReportMetric(emptyCores, "empty-temporal-cores")

	names := applyFleet(b, s, ns, "idle", n, func(_ int, p *v1alpha1.Proxy) {
		stack.Tagged(p, ns)
		p.Spec.HealthCheck.Interval, p.Spec.HealthCheck.Timeout = "", "" // the defaults
	})
	start := time.Now()
	waitAllReady(b, s, ns, n, 30*time.Minute)
	b.Logf("%d Proxies Ready in %s", n, time.Since(start).Round(time.Second))
	// Let the last verdicts, statuses and memos of the way to Ready land before measuring.
	// A large fleet needs longer (IDLE_SETTLE): latencies measured while the machine was
	// busy creating it settle once, one latency report per proxy at most, which is the
	// way to rest, not rest.
	time.Sleep(envDuration(b, "IDLE_SETTLE", time.Minute))

	for b.Loop() {
		// Reading every history takes a while with a large fleet: the events are counted
		// from the middle of one reading to the middle of the next, the server's counters
		// from one read to the next (a flush after the window), so each rate is over the
		// span it counts.
		te0 := time.Now()
		ev0 := fleetHistory(b, s, ns, names)
		te0 = te0.Add(time.Since(te0) / 2)
		a0, err := s.Temporal.Actions(ctx, s.Temporal.Namespace)
		require.NoError(b, err)
		ta0 := time.Now()
		r0 := reportsByReason(b, reg)
		cpu0, t0 := takeCPUSample(), time.Now()
		time.Sleep(window) // the measurement window itself, not synchronisation
		cpu1, elapsed := takeCPUSample(), time.Since(t0)
		r1 := reportsByReason(b, reg)
		// The server flushes its counters every second: read them after one more flush.
		time.Sleep(2 * time.Second)
		a1, err := s.Temporal.Actions(ctx, s.Temporal.Namespace)
		require.NoError(b, err)
		actionsSpan := time.Since(ta0)
		te1 := time.Now()
		ev1 := fleetHistory(b, s, ns, names)
		eventsSpan := te1.Add(time.Since(te1) / 2).Sub(te0)

		perHour := func(delta float64) float64 { return delta / float64(n) / elapsed.Hours() }
		actionsPerHour := func(delta float64) float64 { return delta / float64(n) / actionsSpan.Hours() }
		eventsPerHour := func(delta float64) float64 { return delta / float64(n) / eventsSpan.Hours() }
		var kinds []string
		total := 0.0
		for k := range a1 {
			if d := a1[k] - a0[k]; d > 0 && k != "workflow_tasks_completed" {
				kinds = append(kinds, k)
				total += d
			}
		}
		sort.Strings(kinds)
		var parts []string
		for _, k := range kinds {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, actionsPerHour(a1[k]-a0[k])))
		}
		heartbeats := a1["grpc_RecordActivityTaskHeartbeat"] - a0["grpc_RecordActivityTaskHeartbeat"]
		tasks := a1["workflow_tasks_completed"] - a0["workflow_tasks_completed"]
		cpu := cpu1.since(cpu0)
		b.Logf("actions per proxy per hour over %s, %d proxies: %s; total %.2f (%.0f a month)",
			actionsSpan.Round(time.Second), n, strings.Join(parts, ", "), actionsPerHour(total), actionsPerHour(total)*hoursPerMonth)
		var why []string
		for _, k := range slices.Sorted(maps.Keys(r1)) {
			if d := r1[k] - r0[k]; d > 0 && !strings.HasPrefix(k, "probe") {
				why = append(why, fmt.Sprintf("%s %.2f", k, perHour(d)))
			}
		}
		probes := r1["probes"] - r0["probes"]
		b.Logf("shard reports per proxy per hour, by reason: %v; %.0f successful probes a second, %.1f ms on average",
			why, probes/elapsed.Seconds(), 1000*(r1["probe seconds"]-r0["probe seconds"])/max(probes, 1))
		b.Logf("workflow tasks per proxy per hour %.2f; history events per proxy per hour %.2f; CPU (cores): %s",
			actionsPerHour(tasks), eventsPerHour(float64(ev1-ev0)), cpu.cores(elapsed))
		b.ReportMetric(actionsPerHour(total), "actions/proxy/hour")
		b.ReportMetric(actionsPerHour(total)*hoursPerMonth, "actions/proxy/month")
		b.ReportMetric(actionsPerHour(heartbeats), "heartbeats/proxy/hour")
		b.ReportMetric(actionsPerHour(tasks), "workflow-tasks/proxy/hour")
		b.ReportMetric(eventsPerHour(float64(ev1-ev0)), "history-events/proxy/hour")
		cores := cpu["temporal"].Seconds() / elapsed.Seconds()
		b.ReportMetric(cores*1000/float64(n), "temporal-cores/1000-proxies")
		b.ReportMetric(max(cores-emptyCores, 0)*1000/float64(n), "temporal-cores-over-baseline/1000-proxies")

		// What discovery needs for this fleet: a full read of the index, a pass of changes
		// (none here), and the index's memory per proxy.
		full, incr, perProxy := measureIndex(b, s, ns, n)
		b.Logf("discovery over %d proxies: full refresh %s, incremental (nothing changed) %s, index %.0f bytes/proxy",
			n, full.Round(time.Millisecond), incr.Round(time.Millisecond), perProxy)
		b.ReportMetric(float64(full.Milliseconds()), "discovery-full-ms")
		b.ReportMetric(float64(incr.Microseconds())/1000, "discovery-incremental-ms")
		b.ReportMetric(perProxy, "discovery-index-bytes/proxy")

		// Which part of the server's CPU the shards cause: the same fleet, unwatched, over
		// the baseline's window (the shards are stopped; nothing else changes).
		for k := range worker.DefaultMonitorShards {
			require.NoError(b, s.Temporal.Client.TerminateWorkflow(ctx, contract.MonitorShardWorkflowID(s.TaskQueue, k, worker.DefaultMonitorShards), "", "benchmark: the fleet without its shards"))
		}
		time.Sleep(5 * time.Second) // let the shards' last calls drain before sampling
		ucpu0, ut0 := takeCPUSample(), time.Now()
		time.Sleep(baseWindow) // the measurement window itself, not synchronisation
		ucpu1, uElapsed := takeCPUSample(), time.Since(ut0)
		unwatched := ucpu1.since(ucpu0)["temporal"].Seconds() / uElapsed.Seconds()
		b.Logf("the same fleet with its shards stopped, over %s: dev server %.3f cores; the shards' share %.3f cores",
			uElapsed.Round(time.Second), unwatched, cores-unwatched)
		b.ReportMetric(max(cores-unwatched, 0)*1000/float64(n), "temporal-cores-of-shards/1000-proxies")
	}
}

// reportsByReason reads the worker's proxyfleet_monitor_reports_total by reason, and under
// "probe seconds" and "probes" the sum and count of its successful probes' durations.
func reportsByReason(b *testing.B, reg *prometheus.Registry) map[string]float64 {
	b.Helper()
	mfs, err := reg.Gather()
	require.NoError(b, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				switch {
				case mf.GetName() == "proxyfleet_monitor_reports_total" && l.GetName() == "reason":
					out[l.GetValue()] = m.GetCounter().GetValue()
				case mf.GetName() == "proxyfleet_probe_duration_seconds" && l.GetValue() == "ok":
					out["probe seconds"], out["probes"] = m.GetHistogram().GetSampleSum(), float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return out
}

// measureIndex builds a discovery index of the stack's fleet and reports the fastest of
// three full refreshes, the fastest of three incremental ones, and the heap the index
// holds per proxy (after GC, against the heap before it was built).
func measureIndex(b *testing.B, s *stack.Stack, ns string, n int) (full, incr time.Duration, bytesPerProxy float64) {
	b.Helper()
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	store := discovery.NewStore(time.Hour)
	r := &temporal.Refresher{Client: s.Temporal.Client, Namespace: s.Temporal.Namespace, Store: store, Keyring: s.Keyring}
	full, incr = time.Hour, time.Hour
	for range 3 {
		t0 := time.Now()
		require.NoError(b, r.Full(ctx))
		full = min(full, time.Since(t0))
	}
	require.Len(b, store.List(discovery.Selector{"run": ns}, nil), n, "the index misses proxies")
	for range 3 {
		t0 := time.Now()
		require.NoError(b, r.Incremental(ctx))
		incr = min(incr, time.Since(t0))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(store)
	return full, incr, float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}
