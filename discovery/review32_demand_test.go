package discovery_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
)

// TestReview32RefusedThenServedCountsOnce: a crawler refused a lease and then served one
// (or waiting for one) wants one lease, not two. The demand counts its refusal for 30
// seconds on top of the lease it now holds (or the wait it is in), so the pool is sized
// for twice what the crawler asks.
func TestReview32RefusedThenServedCountsOnce(t *testing.T) {
	pool := map[string]string{"pool": "eu"}
	t.Run("served after the pool grew", func(t *testing.T) {
		h := newWaitHarness(t, defaultConfig(), proxy("eu-0", 10, true, pool))
		c := h.client()
		ctx := context.Background()
		_, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: pool})
		require.NoError(t, err)
		// A second crawler's lease: none left, refused.
		_, err = c.Acquire(ctx, dclient.AcquireRequest{Selector: pool})
		require.True(t, dclient.IsNoMatch(err), "%v", err)
		// The pool grows for it, and its retry is served.
		h.store.Upsert(proxy("eu-1", 10, true, pool))
		_, err = c.Acquire(ctx, dclient.AcquireRequest{Selector: pool})
		require.NoError(t, err)

		d, err := c.Demand(ctx, pool)
		require.NoError(t, err)
		assert.Equal(t, 2, d.Held)
		assert.Equal(t, 2, d.Demand, "two leases are wanted and held; the served refusal still counts (%+v)", *d)
	})
	t.Run("waiting after a refusal", func(t *testing.T) {
		h := newWaitHarness(t, defaultConfig(), proxy("eu-0", 10, true, pool))
		c := h.client()
		ctx := context.Background()
		_, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: pool})
		require.NoError(t, err)
		_, err = c.Acquire(ctx, dclient.AcquireRequest{Selector: pool})
		require.True(t, dclient.IsNoMatch(err), "%v", err)
		// The same crawler tries again, this time with a wait.
		waitCtx, stop := context.WithCancel(ctx)
		defer stop()
		w := acquireAsync(waitCtx, c, dclient.AcquireRequest{Selector: pool, Wait: 30 * time.Second})
		h.waiting(1)

		d, err := c.Demand(ctx, pool)
		require.NoError(t, err)
		assert.Equal(t, 2, d.Demand, "one lease held, one wanted by the crawler that waits (%+v)", *d)
		stop()
		receive(t, w)
	})
}

// TestReview32PoolsStayWatched: "a selector whose demand is asked is watched for ten
// minutes". An autoscaler with more pools than the watch book holds (129+) loses a pool
// a round; and any crawler token that asks 128 throwaway selectors evicts every pool at
// once: the book makes room by dropping the selector asked longest ago, which is the one
// watched longest (a pool asked every 5 s for hours), not the one "watched the shortest
// while" as docs/api.md says. An unwatched pool at zero loses its gateway grow-wait and its
// demand metrics.
func TestReview32PoolsStayWatched(t *testing.T) {
	t.Run("more pools than the book holds", func(t *testing.T) {
		h := newWaitHarness(t, defaultConfig(), poolFleet()...)
		c := h.client()
		ctx := context.Background()
		const pools = 200
		// Two rounds of an autoscaler's looks, 5 s apart per round.
		for range 2 {
			for i := range pools {
				_, err := c.Demand(ctx, map[string]string{"pool": fmt.Sprintf("p%d", i)})
				require.NoError(t, err)
			}
			h.clock.Advance(5 * time.Second)
		}
		exported := selectorsExported(t, h)
		var lost []string
		for i := range pools {
			if !slices.Contains(exported, fmt.Sprintf("pool=p%d", i)) {
				lost = append(lost, fmt.Sprintf("p%d", i))
			}
		}
		assert.Empty(t, lost, "pools asked 5-10 s ago are no longer watched: %d of %d", len(lost), pools)
	})
	t.Run("a client asking many selectors", func(t *testing.T) {
		h := newWaitHarness(t, defaultConfig(), poolFleet()...)
		c := h.client()
		ctx := context.Background()
		// The autoscaler has looked at pool eu for an hour, every 5 s.
		for range 720 {
			_, err := c.Demand(ctx, euPool)
			require.NoError(t, err)
			h.clock.Advance(5 * time.Second)
		}
		// A dashboard (or a hostile crawler) asks about 128 selectors once each.
		for i := range 128 {
			_, err := c.Demand(ctx, map[string]string{"probe": fmt.Sprintf("x%d", i)})
			require.NoError(t, err)
		}
		assert.Contains(t, selectorsExported(t, h), "pool=eu,region=eu",
			"the pool watched for an hour, asked 5 s ago, was evicted by selectors watched for no time at all")
	})
}

// TestReview32JunkRefusalsEraseAPoolsDemand: the refusals remembered are capped (4096),
// oldest out, over every client and selector together, and a refusal is remembered even
// for a selector nothing could ever serve (no proxy has it, no pool is watched for it). A
// crawler looping over selectors no pool offers (a careless retry loop, or a hostile
// token) so pushes the pool's real refusals out within the refusal window: the pool's
// demand forgets the crawlers it turned away.
func TestReview32JunkRefusalsEraseAPoolsDemand(t *testing.T) {
	h := newWaitHarness(t, defaultConfig(), poolFleet()...)
	c := h.client()
	ctx := context.Background()
	_, err := c.Demand(ctx, euPool) // the autoscaler watches the pool
	require.NoError(t, err)
	for range 4 {
		_, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: euPool})
		require.NoError(t, err)
	}
	_, err = c.Acquire(ctx, dclient.AcquireRequest{Selector: euPool})
	require.True(t, dclient.IsNoMatch(err), "%v", err)
	d, err := c.Demand(ctx, euPool)
	require.NoError(t, err)
	require.Equal(t, 1, d.Refused)

	for i := range 4096 {
		_, err := c.Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"country": fmt.Sprintf("zz%d", i)}})
		require.True(t, dclient.IsNoMatch(err), "%v", err)
	}
	d, err = c.Demand(ctx, euPool)
	require.NoError(t, err)
	assert.Equal(t, 1, d.Refused, "the pool's refused crawler, 0 s ago, is forgotten (%+v)", *d)
}
