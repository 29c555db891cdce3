package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"golang.org/x/sync/errgroup"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// fakeProxyWorkflow publishes what a Ready ProxyWorkflow publishes (memo and search
// attributes) and republishes it, with a new latency, on every "touch" signal. Thousands of
// them cost the dev server little, which is what a refresh benchmark needs.
func fakeProxyWorkflow(ctx workflow.Context, ns, name string) error {
	publish := func(latency int64) error {
		m := contract.ProxyMemo{Name: name, Namespace: ns, UID: name, Phase: string(v1alpha1.PhaseReady), Healthy: true,
			IP: "127.0.0.1", Port: 3128, LatencyMillis: latency, MaxLeases: 4,
			Attributes: map[string]string{"region": "bench"}}
		if err := workflow.UpsertMemo(ctx, map[string]any{contract.MemoKey: m}); err != nil {
			return err
		}
		return workflow.UpsertTypedSearchAttributes(ctx,
			contract.SearchAttrPhase.ValueSet(string(v1alpha1.PhaseReady)),
			contract.SearchAttrHealthy.ValueSet(true),
			contract.SearchAttrUpdatedAt.ValueSet(workflow.Now(ctx).UTC()))
	}
	if err := publish(10); err != nil {
		return err
	}
	ch := workflow.GetSignalChannel(ctx, "touch")
	for latency := int64(11); ; latency++ {
		ch.Receive(ctx, nil)
		if err := publish(latency); err != nil {
			return err
		}
	}
}

// startFakeFleet runs n fakeProxyWorkflows (proxies p-0000, p-0001, …) in a namespace of
// their own on a worker of their own, and terminates them when the test ends. It returns
// their workflow IDs.
func startFakeFleet(tb testing.TB, env *testenv.TemporalEnv, n int) []string {
	tb.Helper()
	ctx := context.Background()
	queue := fmt.Sprintf("fake-fleet-%d", time.Now().UnixNano())
	w := worker.New(env.Client, queue, worker.Options{})
	w.RegisterWorkflow(fakeProxyWorkflow)
	require.NoError(tb, w.Start())
	tb.Cleanup(w.Stop)
	ns := fmt.Sprintf("fake-%d", time.Now().UnixNano()%100000)
	ids := make([]string, n)
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		name := fmt.Sprintf("p-%04d", i)
		ids[i] = contract.ProxyWorkflowID(ns, name)
		g.Go(func() error {
			_, err := env.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: ids[i], TaskQueue: queue}, fakeProxyWorkflow, ns, name)
			return err
		})
	}
	require.NoError(tb, g.Wait())
	tb.Cleanup(func() {
		for _, id := range ids {
			_ = env.Client.TerminateWorkflow(ctx, id, "", "test done")
		}
	})
	return ids
}

// BenchmarkIndexRefresh measures one incremental refresh with 1,000 running proxy workflows
// of which 10 changed, beside a full list of all 1,000 in the same run.
//
//	go test ./internal/e2e -run '^$' -bench IndexRefresh -benchtime 1x
func BenchmarkIndexRefresh(b *testing.B) {
	const n, changed = 1000, 10
	env := testenv.Temporal(b)
	ctx := context.Background()
	ids := startFakeFleet(b, env, n)

	store := discovery.NewStore(time.Hour)
	var reads = map[string]int{}
	r := &discovery.Refresher{Client: env.Client, Namespace: env.Namespace, Store: store, Overlap: 500 * time.Millisecond,
		Observe: func(kind string, _ time.Duration, read int, _ error) { reads[kind] = read }}
	require.Eventually(b, func() bool {
		return r.Full(ctx) == nil && len(store.List(discovery.Selector{"region": "bench"}, nil)) == n
	}, 2*time.Minute, 500*time.Millisecond, "the 1,000 workflows never all became visible")

	for b.Loop() {
		// Let the overlap window pass, so the incremental pass sees only the touched ones.
		time.Sleep(time.Second)
		t0 := time.Now()
		require.NoError(b, r.Full(ctx))
		full := time.Since(t0)
		fullRead := reads["full"]

		for i := range changed {
			require.NoError(b, env.Client.SignalWorkflow(ctx, ids[i*97], "", "touch", nil))
		}
		// Wait until visibility shows the 10 changes (the refresher's own watermark query).
		var incr time.Duration
		require.Eventually(b, func() bool {
			t1 := time.Now()
			require.NoError(b, r.Incremental(ctx))
			incr = time.Since(t1)
			return reads["incremental"] >= changed
		}, time.Minute, 50*time.Millisecond)

		b.ReportMetric(float64(full.Microseconds())/1000, "full-ms")
		b.ReportMetric(float64(fullRead), "full-read")
		b.ReportMetric(float64(incr.Microseconds())/1000, "incremental-ms")
		b.ReportMetric(float64(reads["incremental"]), "incremental-read")
		b.ReportMetric(full.Seconds()/incr.Seconds(), "full/incremental")
	}
}
