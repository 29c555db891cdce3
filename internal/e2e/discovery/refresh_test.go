package discovery

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/temporal"
	"github.com/proxyfleet/proxyfleet/internal/stack/fakefleet"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// TestIncrementalReadsWhatChanged: on the real dev server, discovery's incremental pass
// reads the workflows whose memo changed and no others. Its query once also matched every
// running workflow (the visibility store gives them a close time in the future), so each
// pass, every second, read the whole fleet: 27 times the work at 1,000 proxies, enough to
// starve health verdicts of CPU.
func TestIncrementalReadsWhatChanged(t *testing.T) {
	const n, changed = 12, 3
	env := testenv.Temporal(t)
	ctx := context.Background()
	ids := fakefleet.Start(t, env, n)

	store := discovery.NewStore(time.Hour)
	var mu sync.Mutex
	most := 0 // the most workflows one incremental pass read, once counting starts
	counting := false
	r := &temporal.Refresher{Client: env.Client, Namespace: env.Namespace, Store: store, Overlap: 200 * time.Millisecond,
		Observe: func(kind string, _ time.Duration, read int, _ error) {
			mu.Lock()
			defer mu.Unlock()
			if kind == "incremental" && counting {
				most = max(most, read)
			}
		}}
	latency := func(i int) int64 {
		for _, p := range store.List(discovery.Selector{"region": "bench"}, nil) {
			if p.Name == fmt.Sprintf("p-%04d", i) {
				return p.LatencyMillis
			}
		}
		return 0
	}
	require.Eventually(t, func() bool {
		return r.Full(ctx) == nil && len(store.List(discovery.Selector{"region": "bench"}, nil)) >= n
	}, time.Minute, 200*time.Millisecond, "the workflows never all became visible")

	// The overlap window re-reads what changed shortly before the watermark. Let it pass,
	// then move the watermark with one change the incremental pass must see.
	time.Sleep(300 * time.Millisecond) // a window of time, not a synchronisation
	require.NoError(t, env.Client.SignalWorkflow(ctx, ids[n-1], "", fakefleet.Touch, nil))
	require.Eventually(t, func() bool { return r.Incremental(ctx) == nil && latency(n-1) == 11 }, 30*time.Second, 50*time.Millisecond)
	time.Sleep(300 * time.Millisecond)

	mu.Lock()
	counting = true
	mu.Unlock()
	for i := range changed {
		require.NoError(t, env.Client.SignalWorkflow(ctx, ids[i], "", fakefleet.Touch, nil))
	}
	require.Eventually(t, func() bool {
		require.NoError(t, r.Incremental(ctx))
		for i := range changed {
			if latency(i) != 11 {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "the changes never showed")
	mu.Lock()
	defer mu.Unlock()
	assert.LessOrEqual(t, most, changed+1, "an incremental pass read more than the changed workflows (and the last one seen), of %d running", n)
}
