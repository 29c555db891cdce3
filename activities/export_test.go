package activities

import (
	"context"
	"time"
)

// Members exposes a shard's member runner to the package's external tests.
type Members struct{ ms *members }

// NewMembers runs watches with a, reporting through signal under the signal name.
func NewMembers(a *Activities, signal WorkflowSignaller, name string) Members {
	ms := newMembers(a, signal, name)
	ms.retry = 10 * time.Millisecond // tests do not wait out the production backoff
	return Members{ms}
}

// Sync makes the watch of workflow id follow memo, as published by its run run.
func (m Members) Sync(ctx context.Context, id, run string, memo *MonitorMemo, resumed bool) {
	m.ms.sync(ctx, id, watch{memo, run}, resumed)
}
func (m Members) IDs() []string        { return m.ms.ids() }
func (m Members) Ended(id string) bool { return m.ms.ended(id) }
func (m Members) StopAll()             { m.ms.stopAll() }

// ids returns the workflow IDs being watched.
func (ms *members) ids() []string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	out := make([]string, 0, len(ms.byID))
	for id := range ms.byID {
		out = append(out, id)
	}
	return out
}

// ended reports whether the watch of workflowID has ended by itself (or never existed).
func (ms *members) ended(workflowID string) bool {
	ms.mu.Lock()
	m := ms.byID[workflowID]
	ms.mu.Unlock()
	if m == nil {
		return true
	}
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}
