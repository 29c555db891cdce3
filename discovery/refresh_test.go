package discovery_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// fakeLister answers ListWorkflow with err, or with no workflows. failFirst makes the
// first calls fail instead (for Run, which owns the calls).
type fakeLister struct {
	err       error
	failFirst atomic.Int32
	calls     atomic.Int32
}

func (f *fakeLister) ListWorkflow(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	if f.calls.Add(1) <= f.failFirst.Load() {
		return nil, errors.New("temporal unreachable")
	}
	if f.err != nil {
		return nil, f.err
	}
	return &workflowservice.ListWorkflowExecutionsResponse{}, nil
}

// TestRefresherRunRetriesTheFirstLoad: Run keeps trying full passes until one succeeds,
// so a discovery started while Temporal is down serves as soon as Temporal is back, not
// FullEvery later.
func TestRefresherRunRetriesTheFirstLoad(t *testing.T) {
	store := discovery.NewStore(time.Minute)
	lister := &fakeLister{}
	lister.failFirst.Store(3)
	r := &discovery.Refresher{Client: lister, Namespace: "default", Store: store, Log: slog.New(slog.DiscardHandler),
		Interval: 10 * time.Millisecond, FullEvery: time.Hour}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, store.Loaded, 5*time.Second, 5*time.Millisecond, "the index never loaded after Temporal came back")
	assert.GreaterOrEqual(t, lister.calls.Load(), int32(4), "three failed full passes, then one that loaded")
	cancel()
	require.NoError(t, <-done)
}

// TestRefresherLoadsIndex: only a full pass that succeeds loads the index. A Temporal that
// cannot be reached leaves it unloaded (the API keeps answering index_loading) instead of
// loading an empty fleet; incremental passes never load it.
func TestRefresherLoadsIndex(t *testing.T) {
	store := discovery.NewStore(time.Minute)
	lister := &fakeLister{err: errors.New("temporal unreachable")}
	r := &discovery.Refresher{Client: lister, Namespace: "default", Store: store, Log: slog.New(slog.DiscardHandler)}

	require.Error(t, r.Full(t.Context()))
	assert.False(t, store.Loaded(), "a failed full pass")

	lister.err = nil
	require.NoError(t, r.Incremental(t.Context()))
	assert.False(t, store.Loaded(), "an incremental pass")

	require.NoError(t, r.Full(t.Context()))
	assert.True(t, store.Loaded(), "a full pass, even of an empty fleet")
	assert.Equal(t, 0, store.Len())

	lister.err = errors.New("temporal unreachable again")
	require.Error(t, r.Full(t.Context()))
	assert.True(t, store.Loaded(), "the last full index is still served")
}
