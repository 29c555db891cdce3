// What a healthy fleet writes to Temporal while nothing changes: BenchmarkSteadyStateHistory
// counts the history events per Proxy per hour of stable health, against the naive design
// (a probe activity and a timer per interval) in the same run. Feeds the Steady state table
// of docs/benchmarks.md (## Steady state).

package benchmarks

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/proxyfleet/proxyfleet/activities/probe"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// naiveProbe is the baseline design: one probe activity per interval, with a timer between.
func naiveProbe(ctx workflow.Context, proxy, url string, interval time.Duration) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1}})
	for {
		var res probe.Result
		_ = workflow.ExecuteActivity(ctx, "NaiveProbeOnce", proxy, url).Get(ctx, &res)
		if err := workflow.Sleep(ctx, interval); err != nil {
			return err
		}
	}
}

func naiveProbeOnce(ctx context.Context, proxy, url string) (probe.Result, error) {
	return probe.Probe(ctx, probe.Request{Proxy: proxy, URL: url, Timeout: time.Second}), nil
}

func historyLength(b *testing.B, c client.Client, id string) int64 {
	b.Helper()
	d, err := c.DescribeWorkflow(context.Background(), id, "")
	require.NoError(b, err)
	return d.RawResponse.GetWorkflowExecutionInfo().GetHistoryLength()
}

// BenchmarkSteadyStateHistory runs 50 healthy Proxies with a 1s probe interval and counts
// the history events their workflows add per hour of stable health, beside 5 workflows of
// the naive design (one probe activity per interval) measured in the same run.
//
//	STEADY_WINDOW=3m go test ./internal/benchmarks -run '^$' -bench SteadyStateHistory -benchtime 1x -timeout 30m
func BenchmarkSteadyStateHistory(b *testing.B) {
	const n, naiveN = 50, 5
	window := envDuration(b, "STEADY_WINDOW", 2*time.Minute)
	s := stack.Start(b, stack.Options{})
	ctx := context.Background()
	for b.Loop() {
		ns := s.Namespace(b)
		for i := range n {
			require.NoError(b, s.Kube.Client.Create(ctx, s.LocalProxy(ns, fmt.Sprintf("steady-%02d", i))))
		}
		var addrs []string
		for i := range n {
			p := s.WaitFor(b, ns, fmt.Sprintf("steady-%02d", i), 3*time.Minute, "Ready", stack.Ready)
			addrs = append(addrs, net.JoinHostPort(p.Status.IP, strconv.Itoa(int(p.Status.Port))))
		}

		// The baseline: naive probing workflows through the same proxies, same interval.
		queue := s.TaskQueue + "-naive"
		w := worker.New(s.Temporal.Client, queue, worker.Options{})
		w.RegisterWorkflow(naiveProbe)
		w.RegisterActivityWithOptions(naiveProbeOnce, activityName("NaiveProbeOnce"))
		require.NoError(b, w.Start())
		var naiveIDs []string
		for i := range naiveN {
			id := fmt.Sprintf("naive/%s/%d", ns, i)
			_, err := s.Temporal.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue},
				naiveProbe, addrs[i], s.Target.URL+"/healthz", time.Second)
			require.NoError(b, err)
			naiveIDs = append(naiveIDs, id)
		}

		count := func(ids []string) int64 {
			var total int64
			for _, id := range ids {
				total += historyLength(b, s.Temporal.Client, id)
			}
			return total
		}
		var ids []string
		for i := range n {
			ids = append(ids, contract.ProxyWorkflowID(ns, fmt.Sprintf("steady-%02d", i)))
		}
		start, naiveStart, t0 := count(ids), count(naiveIDs), time.Now()
		time.Sleep(window) // the measurement window itself, not synchronisation
		end, naiveEnd, elapsed := count(ids), count(naiveIDs), time.Since(t0)

		perHour := func(delta int64, k int) float64 { return float64(delta) / float64(k) / elapsed.Hours() }
		ours, naive := perHour(end-start, n), perHour(naiveEnd-naiveStart, naiveN)
		b.ReportMetric(ours, "events/proxy/hour")
		b.ReportMetric(naive, "naive-events/proxy/hour")
		b.ReportMetric(float64(end-start), "events-in-window")
		b.ReportMetric(elapsed.Seconds(), "window-s")
		for _, id := range naiveIDs {
			_ = s.Temporal.Client.TerminateWorkflow(ctx, id, "", "benchmark done")
		}
		w.Stop()
	}
}

func activityName(n string) activity.RegisterOptions { return activity.RegisterOptions{Name: n} }
