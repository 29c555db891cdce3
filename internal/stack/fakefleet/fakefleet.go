// Package fakefleet runs stand-ins for a fleet's ProxyWorkflows on the test Temporal
// server: workflows that publish what a Ready ProxyWorkflow publishes (memo and search
// attributes) and nothing else, with no proxy, controller or monitor behind them.
// Thousands of them cost the dev server little, so what reads the fleet from visibility
// (discovery's index refresh) can be tested and measured at a fleet's size. The
// end-to-end test of the incremental refresh and the refresh benchmark share it.
package fakefleet

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

	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Touch is the signal on which a fake proxy publishes again, with its latency one
// millisecond more: a change discovery's incremental refresh must see.
const Touch = "touch"

// fakeProxyWorkflow publishes what a Ready ProxyWorkflow publishes (memo and search
// attributes), with a latency of 10 ms, and republishes it, with a new latency, on every
// Touch signal.
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
	ch := workflow.GetSignalChannel(ctx, Touch)
	for latency := int64(11); ; latency++ {
		ch.Receive(ctx, nil)
		if err := publish(latency); err != nil {
			return err
		}
	}
}

// Start runs n fake proxies (p-0000, p-0001, …, attribute region=bench, latency 10 ms)
// in a namespace of their own on a worker of their own, and terminates them when the
// test ends. It returns their workflow IDs, in order.
func Start(tb testing.TB, env *testenv.TemporalEnv, n int) []string {
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
