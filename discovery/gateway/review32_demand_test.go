package gateway_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
)

// TestReview32GatewayRefusalIsDemand: with --gateway-wait negative ("answer 503 at
// once", a documented setting), a gateway request refused because the pool is full is
// never noted as a refusal, so it is no demand at all: an autoscaled pool whose crawlers
// use the gateway never grows past the leases it already holds (at targetUtilization
// 100 it never grows). docs/api.md: refused counts "clients refused such a proxy in the
// last 30 seconds (no wait, or a wait that ran out)"; an acquire refused the same way is
// counted.
func TestReview32GatewayRefusalIsDemand(t *testing.T) {
	e := newGatewayEnv(t, 1, func(_ *discovery.Config, g *gateway.Config, fleet []discovery.Proxy) {
		fleet[0].MaxLeases = 1
		g.Wait = -1
	})
	host := strings.TrimPrefix(e.site.URL, "http://")
	api := httptest.NewServer(e.srv.Handler())
	defer api.Close()
	ctx := context.Background()
	eu := map[string]string{"region": "eu"}

	// Another crawler holds the pool's only slot.
	_, err := dclient.New(api.URL, otherToken).Acquire(ctx, dclient.AcquireRequest{Selector: eu})
	require.NoError(t, err)
	c := dclient.New(api.URL, gwToken)
	_, err = c.Demand(ctx, eu) // the autoscaler watches the pool
	require.NoError(t, err)

	assert.Equal(t, http.StatusServiceUnavailable, status(t, e.connectAsync(gwClient+";region=eu", host), "full pool"))

	d, err := c.Demand(ctx, eu)
	require.NoError(t, err)
	assert.Equal(t, 1, d.Held)
	assert.Equal(t, 1, d.Refused, "the gateway's crawler was refused a proxy of the pool: demand (%+v)", *d)
}
