package gateway

import "sync"

// slotWaiters is where requests that found every slot they could take in use wait for
// one to free up. Whoever ends a lease calls wake; the wake goes to the waiters in the
// order they came, and one that cannot use the freed slot (it wants other proxies, or its
// site rests on that one) hands it on to the next. A freed slot so costs one attempt at a
// grant when the first waiter can take it, instead of every waiter scanning the fleet
// under the store's lock again and again while nothing changes. Slots that free up where
// no wake is called (a lease that expires, a proxy that turns healthy) are found by each
// waiter's own slow fallback check.
//
// The zero value is ready to use.
type slotWaiters struct {
	mu    sync.Mutex
	queue []*slotWaiter
}

// slotWaiter is one waiting request.
type slotWaiter struct {
	// turn carries a wake to the waiter; it holds at most one, since a waiter that has one
	// pending (signalled) is passed over.
	turn chan struct{}
	// signalled, under slotWaiters.mu, says a wake is in turn and not taken yet.
	signalled bool
}

// join adds a waiter at the back of the queue.
func (q *slotWaiters) join() *slotWaiter {
	w := &slotWaiter{turn: make(chan struct{}, 1)}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queue = append(q.queue, w)
	return w
}

// leave removes w. A wake it was given and did not take goes to the next waiter: the slot
// it stands for is still free for all w knows.
func (q *slotWaiters) leave(w *slotWaiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := q.indexLocked(w)
	if i < 0 {
		return
	}
	q.queue = append(q.queue[:i], q.queue[i+1:]...)
	if w.signalled {
		w.signalled = false
		q.signalLocked(i)
	}
}

// took records that w has taken the wake in its turn and is trying for the slot: a slot
// that frees up meanwhile wakes it again rather than passing it over.
func (q *slotWaiters) took(w *slotWaiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.signalled = false
}

// wake says a slot may have freed up: the first waiter without a pending wake gets one.
func (q *slotWaiters) wake() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.signalLocked(0)
}

// pass hands the wake w took on to the waiters behind it: the slot did not suit w, and may
// suit one of them.
func (q *slotWaiters) pass(w *slotWaiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if i := q.indexLocked(w); i >= 0 {
		q.signalLocked(i + 1)
	}
}

// signalLocked wakes the first waiter from index from on that has no wake pending. When
// every one has, the wake is dropped: each of them will look at the store anyway.
func (q *slotWaiters) signalLocked(from int) {
	for _, w := range q.queue[min(from, len(q.queue)):] {
		if !w.signalled {
			w.signalled = true
			w.turn <- struct{}{}
			return
		}
	}
}

func (q *slotWaiters) indexLocked(w *slotWaiter) int {
	for i, x := range q.queue {
		if x == w {
			return i
		}
	}
	return -1
}
