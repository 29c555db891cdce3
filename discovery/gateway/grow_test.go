package gateway_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
)

// TestGatewayWaitsForAPoolToGrow: a tunnel for proxies none of which exists yet is
// refused at once while nobody sizes those proxies by demand; once their selector is
// watched (a pool's autoscaler asked its demand), such a tunnel waits, counts as demand,
// and is opened through the proxy the index gains.
func TestGatewayWaitsForAPoolToGrow(t *testing.T) {
	var first discovery.Proxy
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, fleet []discovery.Proxy) {
		first = fleet[0]
		g.Wait, g.GrowWait = -1, 30*time.Second
	})
	host := strings.TrimPrefix(e.site.URL, "http://")
	cold := map[string]string{"pool": "cold"}

	// Refused at once: the gateway's own wait is off, and nothing says the pool grows.
	assert.Equal(t, http.StatusServiceUnavailable, status(t, e.connectAsync(gwClient+";pool=cold", host), "unwatched"))

	api := httptest.NewServer(e.srv.Handler())
	defer api.Close()
	c := dclient.New(api.URL, gwToken)
	d, err := c.Demand(context.Background(), cold)
	require.NoError(t, err)
	assert.Zero(t, d.Proxies)

	got := e.connectAsync(gwClient+";pool=cold", host)
	require.Eventually(t, func() bool {
		d, err := c.Demand(context.Background(), cold)
		return err == nil && d.Waiting == 1
	}, 10*time.Second, 5*time.Millisecond, "the tunnel waits, and is the pool's demand")

	// The pool's first proxy arrives in the index.
	grown := first
	grown.Name, grown.Attributes = "cold-0", cold
	e.store.Upsert(grown)
	assert.Equal(t, http.StatusOK, status(t, got, "the tunnel, once the pool has a proxy"))
	d, err = c.Demand(context.Background(), cold)
	require.NoError(t, err)
	assert.Equal(t, 1, d.Held)
	assert.Zero(t, d.Waiting)
}

// TestGatewayWaitsOnOnceAPoolIsWatched: a tunnel for proxies that do not exist waits the
// gateway's short wait; when the selector becomes watched meanwhile (an autoscaler's first
// look at a pool created a moment before the crawl), it waits on past that wait, and is
// opened through the proxy the pool starts. Unwatched, it is refused after the short wait.
func TestGatewayWaitsOnOnceAPoolIsWatched(t *testing.T) {
	var first discovery.Proxy
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, fleet []discovery.Proxy) {
		first = fleet[0]
		g.Wait, g.GrowWait = 300*time.Millisecond, 30*time.Second
	})
	host := strings.TrimPrefix(e.site.URL, "http://")
	api := httptest.NewServer(e.srv.Handler())
	defer api.Close()
	c := dclient.New(api.URL, gwToken)
	ctx := context.Background()

	assert.Equal(t, http.StatusServiceUnavailable, status(t, e.connectAsync(gwClient+";pool=typo", host), "unwatched"),
		"a selector nothing will grow is refused after the short wait")

	asked := time.Now()
	got := e.connectAsync(gwClient+";pool=late", host)
	require.Eventually(t, func() bool { return e.metric("proxyfleet_gateway_waits_total") == 2 }, 10*time.Second, 5*time.Millisecond)
	// The autoscaler's first look: the selector is watched from now on.
	_, err := c.Demand(ctx, map[string]string{"pool": "late"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		d, err := c.Demand(ctx, map[string]string{"pool": "late"})
		return err == nil && time.Since(asked) > time.Second && d.Waiting == 1
	}, 10*time.Second, 5*time.Millisecond, "the short wait ran out long ago, and the tunnel waits on")

	grown := first
	grown.Name, grown.Attributes = "late-0", map[string]string{"pool": "late"}
	e.store.Upsert(grown)
	assert.Equal(t, http.StatusOK, status(t, got, "the tunnel, once the pool has a proxy"))
}

// TestGatewayRetryDoesNotWaitForAPoolToGrow: a request every proxy of a watched pool
// failed (down, or refusing its credentials) is answered with the failures, not held for
// the grow wait as if the pool had no proxy yet: the pool has its proxies, they failed,
// and waiting for one more would hold the crawler for minutes.
func TestGatewayRetryDoesNotWaitForAPoolToGrow(t *testing.T) {
	for _, fault := range []struct {
		name   string
		inject func(p *fleetProxy)
	}{
		{"down", func(p *fleetProxy) { p.ln.Close() }},
		{"refuses its credentials", func(p *fleetProxy) { p.fp.SetFault(local.FaultAuth) }},
	} {
		t.Run(fault.name, func(t *testing.T) {
			e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, _ []discovery.Proxy) {
				g.Wait, g.GrowWait = -1, time.Hour
			})
			api := httptest.NewServer(e.srv.Handler())
			defer api.Close()
			_, err := dclient.New(api.URL, gwToken).Demand(context.Background(), map[string]string{"region": "eu"})
			require.NoError(t, err) // the pool's autoscaler looks: region=eu is watched
			fault.inject(e.proxies[0])

			c := e.client(gwClient+";region=eu", gwToken)
			c.Timeout = 30 * time.Second
			resp, body := get(t, c, e.site.URL+"/plain")
			require.Equal(t, http.StatusBadGateway, resp.StatusCode, body)
			assert.Equal(t, "upstream_failed", gatewayError(t, resp, body).Code)
			assert.Zero(t, e.metric("proxyfleet_gateway_waits_total"), "the retry waited for a pool that has its proxies")
			e.waitNoLeases()
		})
	}
}
