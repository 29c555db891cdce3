package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows"
)

// BenchmarkProvision200 applies 200 local Proxies at once and reports the time until all are
// Provisioned (and Ready), and the history events each workflow used to get there.
//
//	go test ./internal/e2e -run '^$' -bench Provision200 -benchtime 1x
func BenchmarkProvision200(b *testing.B) {
	const n = 200
	s := stack.Start(b, stack.Options{})
	ctx := context.Background()
	for b.Loop() {
		ns := s.Namespace(b)
		start := time.Now()
		var g errgroup.Group
		g.SetLimit(16)
		for i := range n {
			g.Go(func() error {
				return s.Kube.Client.Create(ctx, s.LocalProxy(ns, fmt.Sprintf("bench-%03d", i)))
			})
		}
		require.NoError(b, g.Wait())
		applied := time.Since(start)

		var mu sync.Mutex
		provisionedAt := map[string]time.Duration{}
		deadline := time.Now().Add(5 * time.Minute)
		for len(provisionedAt) < n {
			var list v1alpha1.ProxyList
			require.NoError(b, s.Kube.Client.List(ctx, &list))
			for _, p := range list.Items {
				if p.Namespace == ns && stack.Ready(&p) {
					mu.Lock()
					if _, ok := provisionedAt[p.Name]; !ok {
						provisionedAt[p.Name] = time.Since(start)
					}
					mu.Unlock()
				}
			}
			require.True(b, time.Now().Before(deadline), "only %d of %d Ready after 5m", len(provisionedAt), n)
			time.Sleep(100 * time.Millisecond)
		}
		all := time.Since(start)

		events := int64(0)
		for i := range n {
			d, err := s.Temporal.Client.DescribeWorkflow(ctx, workflows.ProxyWorkflowID(ns, fmt.Sprintf("bench-%03d", i)), "")
			require.NoError(b, err)
			events += d.RawResponse.GetWorkflowExecutionInfo().GetHistoryLength()
		}
		b.ReportMetric(all.Seconds(), "s-until-all-ready")
		b.ReportMetric(applied.Seconds(), "s-to-apply")
		b.ReportMetric(float64(n)/all.Seconds(), "proxies-ready/s")
		b.ReportMetric(float64(events)/n, "history-events/proxy")
	}
}
