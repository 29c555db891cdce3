package discovery_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
)

// poolFleet is two proxies of pool eu taking two leases each, and one in us.
func poolFleet() []discovery.Proxy {
	a := proxy("eu-0", 10, true, map[string]string{"pool": "eu", "region": "eu"})
	b := proxy("eu-1", 10, true, map[string]string{"pool": "eu", "region": "eu"})
	us := proxy("us-0", 10, true, map[string]string{"region": "us"})
	a.MaxLeases, b.MaxLeases = 2, 2
	return []discovery.Proxy{a, b, us}
}

var euPool = map[string]string{"pool": "eu", "region": "eu"}

// TestDemandCountsWhatAPoolCouldServe: the demand on a pool's attributes counts the
// leases held on its proxies, the acquires waiting that its proxies could serve (a
// narrower want included, one for another region not), and each client refused once
// however often it retried, until the refusal window passes.
func TestDemandCountsWhatAPoolCouldServe(t *testing.T) {
	h := newWaitHarness(t, defaultConfig(), poolFleet()...)
	c := h.client()
	ctx := context.Background()

	d, err := c.Demand(ctx, euPool)
	require.NoError(t, err)
	assert.Equal(t, dclient.Demand{Selector: euPool, Proxies: 2, Healthy: 2, Capacity: 4, Replicas: 1}, *d)

	for range 4 {
		_, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"pool": "eu"}})
		require.NoError(t, err)
	}
	// Waiting: one the pool could serve (any proxy of region eu), one it could not.
	waitCtx, stop := context.WithCancel(ctx)
	defer stop()
	euWait := acquireAsync(waitCtx, c, dclient.AcquireRequest{Selector: map[string]string{"region": "eu"}, Wait: 30 * time.Second})
	h.waiting(1)
	// us-0 is free: fill it, then wait for another.
	_, err = c.Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "us"}})
	require.NoError(t, err)
	usWait := acquireAsync(waitCtx, c, dclient.AcquireRequest{Selector: map[string]string{"region": "us"}, Wait: 30 * time.Second})
	h.waiting(2)
	// Refused, without a wait, three times: one client, counted once.
	for range 3 {
		_, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: euPool})
		require.True(t, dclient.IsNoMatch(err), "%v", err)
	}
	// Refused for something the pool does not offer: not its demand.
	_, err = c.Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"region": "eu", "country": "de"}})
	require.True(t, dclient.IsNoMatch(err), "%v", err)

	d, err = c.Demand(ctx, euPool)
	require.NoError(t, err)
	assert.Equal(t, dclient.Demand{Selector: euPool, Proxies: 2, Healthy: 2, Capacity: 4, Held: 4, LeasedProxies: 2,
		Waiting: 1, Refused: 1, Demand: 6, Replicas: 1}, *d)

	// The demand of the watched selector is exported, and the refusal ages out.
	assert.Equal(t, 1.0, metricValue(t, h.reg, "proxyfleet_discovery_demand_leases", "selector", "pool=eu,region=eu", "kind", "waiting"))
	assert.Equal(t, 4.0, metricValue(t, h.reg, "proxyfleet_discovery_demand_leases", "selector", "pool=eu,region=eu", "kind", "held"))
	assert.Equal(t, 1.0, metricValue(t, h.reg, "proxyfleet_discovery_demand_leases", "selector", "pool=eu,region=eu", "kind", "refused"))
	assert.Equal(t, 4.0, metricValue(t, h.reg, "proxyfleet_discovery_demand_capacity_leases", "selector", "pool=eu,region=eu"))
	h.clock.Advance(discovery.RefusalWindow + time.Second)
	d, err = c.Demand(ctx, euPool)
	require.NoError(t, err)
	assert.Equal(t, 0, d.Refused)
	assert.Equal(t, 5, d.Demand)

	stop()
	receive(t, euWait)
	receive(t, usWait)
	h.waiting(0)
}

// TestDemandWatchesAreBounded: a selector asked about is exported for ten minutes after
// the last ask, and no more than a bounded number of selectors are, however many are
// asked about: the metric's series stay bounded, and the selectors watched longest stay.
func TestDemandWatchesAreBounded(t *testing.T) {
	h := newWaitHarness(t, defaultConfig(), poolFleet()...)
	c := h.client()
	ctx := context.Background()
	for i := range 1500 {
		_, err := c.Demand(ctx, map[string]string{"pool": fmt.Sprintf("p%d", i)})
		require.NoError(t, err)
		h.clock.Advance(100 * time.Millisecond)
	}
	series := func() int {
		mfs, err := h.reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "proxyfleet_discovery_demand_capacity_leases" {
				return len(mf.GetMetric())
			}
		}
		return 0
	}
	n := series()
	assert.Positive(t, n)
	assert.LessOrEqual(t, n, 1024)
	// The first asked (watched the longest) are kept; the last asked took the place of
	// the one before it.
	assert.Contains(t, selectorsExported(t, h), "pool=p0")
	assert.Contains(t, selectorsExported(t, h), "pool=p1499")
	assert.NotContains(t, selectorsExported(t, h), "pool=p1498")

	h.clock.Advance(11 * time.Minute)
	assert.Zero(t, series(), "watches end ten minutes after the last ask")
}

func selectorsExported(t *testing.T, h *waitHarness) []string {
	t.Helper()
	mfs, err := h.reg.Gather()
	require.NoError(t, err)
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "proxyfleet_discovery_demand_capacity_leases" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "selector" {
					out = append(out, l.GetValue())
				}
			}
		}
	}
	return out
}

// TestDemandAcrossReplicas: asked of one replica, the demand adds what the others alone
// know (their waiting acquires and refusals) to the leases every replica knows; a replica
// that cannot answer makes the answer partial rather than failing it.
func TestDemandAcrossReplicas(t *testing.T) {
	rs := newReplicaSet(t, 3, poolFleet())
	ctx := context.Background()
	for range 4 {
		_, err := rs.Client(0).Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"pool": "eu"}})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return rs.Nodes[1].Store.Stats().Leases == 4 && rs.Nodes[2].Store.Stats().Leases == 4 },
		10*time.Second, 5*time.Millisecond)
	// The autoscaler's look watches the pool on every replica: refusals count from then.
	_, err := rs.Client(0).Demand(ctx, euPool)
	require.NoError(t, err)
	waitCtx, stop := context.WithCancel(ctx)
	defer stop()
	w := acquireAsync(waitCtx, rs.Client(1), dclient.AcquireRequest{Selector: euPool, Wait: 30 * time.Second})
	require.Eventually(t, func() bool { return rs.Nodes[1].API.Waiting() == 1 }, 10*time.Second, 5*time.Millisecond)
	_, err = rs.Client(2).Acquire(ctx, dclient.AcquireRequest{Selector: euPool})
	require.True(t, dclient.IsNoMatch(err), "%v", err)

	d, err := rs.Client(0).Demand(ctx, euPool)
	require.NoError(t, err)
	assert.Equal(t, dclient.Demand{Selector: euPool, Proxies: 2, Healthy: 2, Capacity: 4, Held: 4, LeasedProxies: 2,
		Waiting: 1, Refused: 1, Demand: 6, Replicas: 3}, *d)

	stop()
	receive(t, w)
	rs.Kill(2)
	d, err = rs.Client(0).Demand(ctx, euPool)
	require.NoError(t, err)
	assert.True(t, d.Partial, "replica 2 is down")
	assert.Equal(t, 2, d.Replicas)
	assert.Equal(t, 4, d.Held)
}
