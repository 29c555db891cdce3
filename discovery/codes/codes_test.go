package codes

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestEveryCodeIsAnError: every code answers with an error status on each door, and
// the gateway's outcome labels are the ones its metric documents.
func TestEveryCodeIsAnError(t *testing.T) {
	outcomes := []string{"invalid", "auth_failed", "throttled", "no_proxy", "upstream_failed", "unavailable", "internal"}
	for _, c := range All() {
		m := Of(c)
		assert.GreaterOrEqual(t, m.Status, 400, c)
		assert.GreaterOrEqual(t, m.GatewayStatus, 400, c)
		assert.Contains(t, outcomes, m.Outcome, c)
	}
}

// TestGatewayReadsSomeCodesOtherwise: a proxy client is told 503 when no proxy is free
// (a 409 means nothing to it), 407 for its credentials and 502 when no fleet proxy
// carried the request; everything else is the API's status.
func TestGatewayReadsSomeCodesOtherwise(t *testing.T) {
	assert.Equal(t, http.StatusConflict, Status(NoMatch))
	assert.Equal(t, http.StatusServiceUnavailable, Of(NoMatch).GatewayStatus)
	assert.Equal(t, http.StatusProxyAuthRequired, Of(ProxyAuthRequired).GatewayStatus)
	assert.Equal(t, http.StatusBadGateway, Of(UpstreamFailed).GatewayStatus)
	assert.Equal(t, Status(TooManyRequests), Of(TooManyRequests).GatewayStatus)
	assert.Equal(t, "throttled", Of(LeaseLimit).Outcome)
}

// TestUnknownCodeIsInternal: a code the table does not know is an internal error, never
// a 200 or a panic.
func TestUnknownCodeIsInternal(t *testing.T) {
	assert.Equal(t, Meaning{Status: http.StatusInternalServerError, GatewayStatus: http.StatusInternalServerError, Outcome: "internal"}, Of("no_such_code"))
}

// TestAPICodesLeaveOutOtherDoors: the lease API's codes are every code but the gateway's
// and the peers' own.
func TestAPICodesLeaveOutOtherDoors(t *testing.T) {
	api := API()
	for _, c := range []string{ProxyAuthRequired, UpstreamFailed, ProxyUnavailable} {
		assert.NotContains(t, api, c)
	}
	assert.Len(t, api, len(All())-3)
}
