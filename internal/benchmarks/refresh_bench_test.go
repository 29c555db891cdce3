// What discovery's index refresh reads: BenchmarkIndexRefresh times an incremental refresh
// over 1,000 running (fake) proxy workflows of which 10 changed, beside a full list in the
// same run. Feeds the two index-refresh rows of the Discovery table of docs/benchmarks.md
// (## Discovery).

package benchmarks

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/temporal"
	"github.com/proxyfleet/proxyfleet/internal/stack/fakefleet"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// BenchmarkIndexRefresh measures one incremental refresh with 1,000 running proxy workflows
// of which 10 changed, beside a full list of all 1,000 in the same run.
//
//	go test ./internal/benchmarks -run '^$' -bench IndexRefresh -benchtime 1x
func BenchmarkIndexRefresh(b *testing.B) {
	const n, changed = 1000, 10
	env := testenv.Temporal(b)
	ctx := context.Background()
	ids := fakefleet.Start(b, env, n)

	store := discovery.NewStore(time.Hour)
	var reads = map[string]int{}
	r := &temporal.Refresher{Client: env.Client, Namespace: env.Namespace, Store: store, Overlap: 500 * time.Millisecond,
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
			require.NoError(b, env.Client.SignalWorkflow(ctx, ids[i*97], "", fakefleet.Touch, nil))
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
