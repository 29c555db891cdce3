//go:build linux

package gateway

import (
	"container/heap"
	"time"
)

// A loop's deadlines: the bounds of its tunnels' states, kept in a heap of its own and
// checked between batches of events, with one runtime timer per loop to wake it for the
// earliest. A runtime timer per deadline cost more than the rest of a short tunnel's
// bookkeeping: adding one can wake a thread of the runtime to watch it.

// deadline is a function due at a time on the loop, until cancelled.
type deadline struct {
	at  time.Time
	fn  func()
	idx int // in the heap; -1 once out of it
}

type deadlineHeap []*deadline

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *deadlineHeap) Push(x any) {
	d := x.(*deadline)
	d.idx = len(*h)
	*h = append(*h, d)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	d := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	d.idx = -1
	return d
}

// after runs fn on the loop once d has passed, unless the deadline is cancelled first.
func (l *loop) after(d time.Duration, fn func()) *deadline {
	dl := &deadline{at: time.Now().Add(d), fn: fn}
	heap.Push(&l.due, dl)
	return dl
}

// cancel takes dl out of the heap (nil, or already run: nothing).
func (l *loop) cancel(dl *deadline) {
	if dl != nil && dl.idx >= 0 {
		heap.Remove(&l.due, dl.idx)
	}
}

// fireDue runs the deadlines that have passed, and says whether any did.
func (l *loop) fireDue() bool {
	if len(l.due) == 0 {
		return false
	}
	now := time.Now()
	fired := false
	for len(l.due) > 0 && !l.due[0].at.After(now) {
		dl := heap.Pop(&l.due).(*deadline)
		dl.fn()
		fired = true
	}
	return fired
}

// wakeForDue sets the loop's timer for its earliest deadline before it parks. A timer
// already set no later stays: one that goes off early finds nothing due and is set again.
func (l *loop) wakeForDue() {
	if len(l.due) == 0 {
		return
	}
	next := l.due[0].at
	if l.wakeSet && !next.Before(l.wakeAt) {
		return
	}
	l.wakeAt, l.wakeSet = next, true
	d := max(time.Until(next), 0)
	if l.wake == nil {
		l.wake = time.AfterFunc(d, func() { l.post(func() { l.wakeSet = false }) })
		return
	}
	l.wake.Reset(d)
}
