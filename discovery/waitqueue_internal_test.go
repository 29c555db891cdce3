package discovery

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// woken says whether w has a wake waiting, and takes it.
func woken(q *waitQueue, w *waiter) bool {
	select {
	case <-w.turn:
		q.Took(w)
		return true
	default:
		return false
	}
}

// TestWaitQueueTakesTurns: a wake goes to the first waiter that has none pending; one
// the slot does not suit passes it to those behind it; one that leaves with a wake it
// did not take hands it on; a wake while every waiter has one pending is dropped.
func TestWaitQueueTakesTurns(t *testing.T) {
	var q waitQueue
	q.Wake() // nobody waits: nothing to do
	a, b, c := q.Join(nil), q.Join(nil), q.Join(nil)

	q.Wake()
	assert.True(t, woken(&q, a), "the first waiter first")
	assert.False(t, woken(&q, b))

	// a tries, and the freed slot is not one it can take: b is next.
	q.Pass(a)
	assert.True(t, woken(&q, b))
	assert.False(t, woken(&q, c))

	// Two slots free up while a and b are trying: a is woken again, then c.
	q.Wake()
	q.Wake()
	assert.True(t, woken(&q, a))
	assert.True(t, woken(&q, b))
	assert.False(t, woken(&q, c), "b had taken its wake: the second wake went to b again, not c")

	// Every waiter has a wake pending: another one is dropped.
	q.Wake()
	q.Wake()
	q.Wake()
	q.Wake()
	assert.True(t, woken(&q, a))
	assert.True(t, woken(&q, b))
	assert.True(t, woken(&q, c))
	assert.False(t, woken(&q, a))

	// a leaves with a wake it never took: c, behind it, gets it (b has one pending).
	q.Wake()
	q.Wake()
	q.Leave(a)
	assert.True(t, woken(&q, c))
	assert.True(t, woken(&q, b))
	q.Leave(b)
	q.Leave(c)
	require.Empty(t, q.queue)
	q.Pass(c) // one that left passes nothing on
}
