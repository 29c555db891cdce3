package gateway

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

// woken says whether w has a wake waiting, and takes it.
func woken(q *slotWaiters, w *slotWaiter) bool {
	select {
	case <-w.turn:
		q.took(w)
		return true
	default:
		return false
	}
}

// TestSlotWaitersTakeTurns: a wake goes to the first waiter that has none pending; one
// the slot does not suit passes it to those behind it; one that leaves with a wake it
// did not take hands it on; a wake while every waiter has one pending is dropped.
func TestSlotWaitersTakeTurns(t *testing.T) {
	var q slotWaiters
	q.wake() // nobody waits: nothing to do
	a, b, c := q.join(), q.join(), q.join()

	q.wake()
	assert.True(t, woken(&q, a), "the first waiter first")
	assert.False(t, woken(&q, b))

	// a tries, and the freed slot is not one it can take: b is next.
	q.pass(a)
	assert.True(t, woken(&q, b))
	assert.False(t, woken(&q, c))

	// Two slots free up while a and b are trying: a is woken again, then c.
	q.wake()
	q.wake()
	assert.True(t, woken(&q, a))
	assert.True(t, woken(&q, b))
	assert.False(t, woken(&q, c), "b had taken its wake: the second wake went to b again, not c")

	// Every waiter has a wake pending: another one is dropped.
	q.wake()
	q.wake()
	q.wake()
	q.wake()
	assert.True(t, woken(&q, a))
	assert.True(t, woken(&q, b))
	assert.True(t, woken(&q, c))
	assert.False(t, woken(&q, a))

	// a leaves with a wake it never took: c, behind it, gets it (b has one pending).
	q.wake()
	q.wake()
	q.leave(a)
	assert.True(t, woken(&q, c))
	assert.True(t, woken(&q, b))
	q.leave(b)
	q.leave(c)
	require.Empty(t, q.queue)
	q.pass(c) // one that left passes nothing on
}

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
