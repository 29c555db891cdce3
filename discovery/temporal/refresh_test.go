package temporal_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/temporal"
	"github.com/proxyfleet/proxyfleet/discovery/temporal/temporaltest"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestRefresherRunRetriesTheFirstLoad: Run keeps trying full passes until one succeeds,
// so a discovery started while Temporal is down serves as soon as Temporal is back, not
// FullEvery later.
func TestRefresherRunRetriesTheFirstLoad(t *testing.T) {
	store := discovery.NewStore(time.Minute)
	lister := &temporaltest.Lister{}
	lister.FailFirst.Store(3)
	r := &temporal.Refresher{Client: lister, Namespace: "default", Store: store, Log: slog.New(slog.DiscardHandler),
		Interval: 10 * time.Millisecond, FullEvery: time.Hour}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, store.Loaded, 5*time.Second, 5*time.Millisecond, "the index never loaded after Temporal came back")
	assert.GreaterOrEqual(t, lister.Calls.Load(), int32(4), "three failed full passes, then one that loaded")
	cancel()
	require.NoError(t, <-done)
}

// TestRefresherLoadsIndex: only a full pass that succeeds loads the index. A Temporal that
// cannot be reached leaves it unloaded (the API keeps answering index_loading) instead of
// loading an empty fleet; incremental passes never load it.
func TestRefresherLoadsIndex(t *testing.T) {
	store := discovery.NewStore(time.Minute)
	lister := &temporaltest.Lister{Err: errors.New("temporal unreachable")}
	r := &temporal.Refresher{Client: lister, Namespace: "default", Store: store, Log: slog.New(slog.DiscardHandler)}

	require.Error(t, r.Full(t.Context()))
	assert.False(t, store.Loaded(), "a failed full pass")

	lister.Err = nil
	require.NoError(t, r.Incremental(t.Context()))
	assert.False(t, store.Loaded(), "an incremental pass")

	require.NoError(t, r.Full(t.Context()))
	assert.True(t, store.Loaded(), "a full pass, even of an empty fleet")
	assert.Equal(t, 0, store.Len())

	lister.Err = errors.New("temporal unreachable again")
	require.Error(t, r.Full(t.Context()))
	assert.True(t, store.Loaded(), "the last full index is still served")
}

// TestIncrementalDropsClosedRuns: a run that ended without publishing anything (terminated
// by hand, or by a server limit) leaves the index at the next incremental pass; a run that
// continued as new does not, even before its successor's memo is visible.
func TestIncrementalDropsClosedRuns(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	lister := &temporaltest.Scripted{}
	store := discovery.NewStore(time.Minute)
	r := &temporal.Refresher{Client: lister, Namespace: "default", Store: store, Log: slog.New(slog.DiscardHandler)}
	lister.Set(
		temporaltest.Run{Memo: temporaltest.ReadyMemo("a"), Status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, Updated: base},
		temporaltest.Run{Memo: temporaltest.ReadyMemo("b"), Status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, Updated: base},
		temporaltest.Run{Memo: temporaltest.ReadyMemo("c"), Status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, Updated: base},
	)
	require.NoError(t, r.Full(t.Context()))
	require.Equal(t, 3, store.Len())

	lister.Set(
		temporaltest.Run{Memo: temporaltest.ReadyMemo("a"), Status: enums.WORKFLOW_EXECUTION_STATUS_TERMINATED, Updated: base, Closed: base.Add(time.Hour)},
		temporaltest.Run{Memo: temporaltest.ReadyMemo("b"), Status: enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW, Updated: base, Closed: base.Add(time.Hour)},
		temporaltest.Run{Memo: temporaltest.ReadyMemo("c"), Status: enums.WORKFLOW_EXECUTION_STATUS_FAILED, Updated: base, Closed: base.Add(time.Hour)},
	)
	require.NoError(t, r.Incremental(t.Context()))
	assert.Equal(t, 1, store.Len(), "the terminated and the failed run are gone")
	_, err := store.Acquire(nil, "", time.Minute)
	require.NoError(t, err, "the continued run's proxy is still leased")
}

// TestTheLatestRunIsTheProxy: a run's close reaches visibility after the fact, so the run
// terminated by hand and the run the operator started again after it can both be listed
// as running; the index holds what the later one published (here: not Ready yet), in a
// full pass and in an incremental one alike, whatever order they are listed in.
func TestTheLatestRunIsTheProxy(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	provisioning := temporaltest.ReadyMemo("a")
	provisioning.Phase, provisioning.Healthy = contract.PhasePending, false
	old := temporaltest.Run{Memo: temporaltest.ReadyMemo("a"), Status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, Updated: base, Started: base.Add(-time.Hour)}
	next := temporaltest.Run{Memo: provisioning, Status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, Updated: base.Add(time.Second), Started: base}
	lister := &temporaltest.Scripted{}
	for _, order := range [][]temporaltest.Run{{old, next}, {next, old}} {
		lister.Set(order...)
		for pass, run := range map[string]func(*temporal.Refresher, context.Context) error{
			"full": (*temporal.Refresher).Full, "incremental": (*temporal.Refresher).Incremental,
		} {
			store := discovery.NewStore(time.Minute)
			r := &temporal.Refresher{Client: lister, Namespace: "default", Store: store, Log: slog.New(slog.DiscardHandler)}
			require.NoError(t, run(r, t.Context()))
			list := store.List(discovery.Selector{}, nil)
			require.Len(t, list, 1, pass)
			assert.Equal(t, contract.PhasePending, list[0].Phase, "%s pass: the ended run's Ready memo was taken", pass)
		}
	}
}

// TestReplacingProxiesStayLeasable: a proxy whose instance is being replaced stays in the
// pool while its memo says it is healthy (runs of workflow version 5 on), and its leases
// renew; when the replacement takes over, a renewal ends the lease with proxy_gone
// "replaced". A memo of an older run (Replacing, not healthy) keeps the proxy out.
func TestReplacingProxiesStayLeasable(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	lister := &temporaltest.Scripted{}
	store := discovery.NewStore(time.Minute)
	r := &temporal.Refresher{Client: lister, Namespace: "default", Store: store, Log: slog.New(slog.DiscardHandler)}
	serving := temporaltest.ReadyMemo("a")
	serving.Phase = contract.PhaseReplacing
	older := temporaltest.ReadyMemo("b")
	older.Phase, older.Healthy = contract.PhaseReplacing, false
	lister.Set(
		temporaltest.Run{Memo: serving, Status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, Updated: base},
		temporaltest.Run{Memo: older, Status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, Updated: base},
	)
	require.NoError(t, r.Full(t.Context()))
	l, err := store.Acquire(nil, "", time.Minute)
	require.NoError(t, err, "the instance being replaced is leased")
	assert.Equal(t, "a", l.Proxy.Name)
	_, err = store.Acquire(nil, "", time.Minute)
	var none *discovery.NoMatch
	require.ErrorAs(t, err, &none, "a Replacing memo that is not healthy is not leased")

	_, err = store.Renew("", l.ID, time.Minute)
	require.NoError(t, err, "a lease on the serving instance renews while it is replaced")

	promoted := serving
	promoted.Phase, promoted.IP = contract.PhaseReady, "127.0.0.2"
	lister.Set(temporaltest.Run{Memo: promoted, Status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, Updated: base.Add(time.Minute)},
		temporaltest.Run{Memo: older, Status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, Updated: base})
	require.NoError(t, r.Full(t.Context()))
	_, err = store.Renew("", l.ID, time.Minute)
	var gone *discovery.ProxyGone
	require.ErrorAs(t, err, &gone)
	assert.Equal(t, discovery.ProxyGoneReplaced, gone.Reason)
}
