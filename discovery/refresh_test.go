package discovery_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// fakeLister answers ListWorkflow with err, or with no workflows.
type fakeLister struct{ err error }

func (f *fakeLister) ListWorkflow(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	if f.err != nil {
		return nil, f.err
	}
	return &workflowservice.ListWorkflowExecutionsResponse{}, nil
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
