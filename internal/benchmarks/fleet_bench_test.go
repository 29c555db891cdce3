// Provisioning at a fleet's size against what the dev server can do at all:
// BenchmarkProvisionFleet applies 1,000 local Proxies (FLEET_N) and reports Proxies made
// Ready per second against the raw SignalWithStart rate of an idle workflow measured in
// the same run, history events per Proxy, and each server process's CPU per Proxy. Feeds
// the 1,000-Proxy rows of the Provisioning table of docs/benchmarks.md (## Provisioning)
// and the explanation under it of why the ratio target is missed.

package benchmarks

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"golang.org/x/sync/errgroup"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// idleWorkflow receives signals and does nothing else: the cheapest thing a
// SignalWithStart can reach, so its rate bounds what the dev server can do per Proxy.
func idleWorkflow(ctx workflow.Context) error {
	ch := workflow.GetSignalChannel(ctx, "poke")
	for {
		ch.Receive(ctx, nil)
	}
}

// BenchmarkProvisionFleet applies FLEET_N (default 1,000) local Proxies (16 creates in flight)
// and reports the time until all are Ready, Proxies made Ready per second, that rate as a
// share of the dev server's raw SignalWithStart rate on an idle workflow measured in the same
// run (target ≥ 0.2), and history events per Proxy from apply to Ready (target ≤ 40). Probes
// run every 10 s, the default, so the fleet's steady load is realistic. It also reports the
// CPU each server process spent per Proxy made Ready, and the dev server's CPU per baseline
// call, to show where the limit is.
//
//	FLEET_N=1000 go test ./internal/benchmarks -run '^$' -bench ProvisionFleet -benchtime 1x -timeout 60m
func BenchmarkProvisionFleet(b *testing.B) {
	n := envInt(b, "FLEET_N", 1000)
	s := stack.Start(b, stack.Options{})
	ctx := context.Background()

	// Baseline: SignalWithStart calls per second against one idle workflow, with the same
	// concurrency the controller uses (8 reconciles at once).
	queue := s.TaskQueue + "-idle"
	w := worker.New(s.Temporal.Client, queue, worker.Options{})
	w.RegisterWorkflow(idleWorkflow)
	require.NoError(b, w.Start())
	defer w.Stop()
	const baseCalls = 2000
	var next atomic.Int64
	var g errgroup.Group
	t0 := time.Now()
	cpu0 := takeCPUSample()
	for range 8 {
		g.Go(func() error {
			for next.Add(1) <= baseCalls {
				_, err := s.Temporal.Client.SignalWithStartWorkflow(ctx, "idle/"+s.TaskQueue, "poke", nil,
					client.StartWorkflowOptions{TaskQueue: queue}, idleWorkflow)
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	require.NoError(b, g.Wait())
	baseRate := baseCalls / time.Since(t0).Seconds()
	baseCPU := takeCPUSample().since(cpu0)
	_ = s.Temporal.Client.TerminateWorkflow(ctx, "idle/"+s.TaskQueue, "", "baseline done")

	for b.Loop() {
		ns := s.Namespace(b)
		start := time.Now()
		cpu0 := takeCPUSample()
		names := applyFleet(b, s, ns, "fleet", n, func(_ int, p *v1alpha1.Proxy) {
			p.Spec.HealthCheck.Interval, p.Spec.HealthCheck.Timeout = "10s", "5s"
		})
		applied := time.Since(start)

		waitAllReady(b, s, ns, n, 30*time.Minute)
		all := time.Since(start)
		cpu := takeCPUSample().since(cpu0)

		events := fleetHistory(b, s, ns, names)
		readyRate := float64(n) / all.Seconds()
		b.ReportMetric(all.Seconds(), "s-until-all-ready")
		b.ReportMetric(applied.Seconds(), "s-to-apply")
		b.ReportMetric(readyRate, "proxies-ready/s")
		b.ReportMetric(baseRate, "baseline-signalwithstart/s")
		b.ReportMetric(readyRate/baseRate, "ratio")
		b.ReportMetric(float64(events)/float64(n), "history-events/proxy")
		// Where the CPU went: per Proxy made Ready, and per baseline call.
		ms := func(d time.Duration, per int) float64 { return float64(d.Microseconds()) / 1000 / float64(per) }
		b.ReportMetric(ms(baseCPU["temporal"], baseCalls), "temporal-cpu-ms/signalwithstart")
		for proc, d := range cpu {
			b.ReportMetric(ms(d, n), strings.ReplaceAll(proc, " ", "-")+"-cpu-ms/proxy")
		}
	}
}
