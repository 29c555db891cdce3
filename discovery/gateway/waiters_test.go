package gateway

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

// TestWorthWaiting: a refusal for want of a free slot is worth waiting on, from this
// replica's store or as the owner's answer in a replica set; one nothing will change is
// not.
func TestWorthWaiting(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"full", &discovery.NoMatch{Considered: 2, AtCapacity: 2}, true},
		{"resting", &discovery.NoMatch{Considered: 1, InCooldown: 1}, true},
		{"unhealthy", &discovery.NoMatch{Considered: 2, Unhealthy: 2}, false},
		{"nothing matches", &discovery.NoMatch{}, false},
		{"at the client's cap", &discovery.LeaseLimit{Client: "shop", Max: 1}, true},
		{"the owner's 409", &discovery.APIError{Code: codes.NoMatch, NoMatch: &discovery.NoMatch{Considered: 1, AtCapacity: 1}}, true},
		{"the owner's 409, none healthy", &discovery.APIError{Code: codes.NoMatch, NoMatch: &discovery.NoMatch{Considered: 1, Unhealthy: 1}}, false},
		{"the owner's lease_limit", &discovery.APIError{Code: codes.LeaseLimit}, true},
		{"the owner is down", discovery.Unavailable("replica 1 did not answer"), false},
	} {
		assert.Equal(t, tc.want, worthWaiting(tc.err), tc.name)
	}
}
