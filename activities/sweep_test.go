package activities_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// memProvider is a provider whose instances are a list in memory: what the sweep lists
// and deletes, at any size.
type memProvider struct {
	provider.Provider
	mu        sync.Mutex
	instances map[string]provider.Instance
	failOn    map[string]bool // provider IDs whose delete fails
	deleted   []string
}

func (p *memProvider) ListOwned(_ context.Context, owner provider.Owner) ([]provider.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []provider.Instance
	for _, inst := range p.instances {
		if owner.Owns(inst.Labels) {
			out = append(out, inst)
		}
	}
	return out, nil
}

func (p *memProvider) Delete(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failOn[id] {
		return errors.New("500 backend error")
	}
	delete(p.instances, id)
	p.deleted = append(p.deleted, id)
	return nil
}

// listerFunc lists running workflows (the Fn-field fake of activities.WorkflowLister).
type listerFunc func(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error)

func (f listerFunc) ListWorkflow(ctx context.Context, req *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	return f(ctx, req)
}

// runningWith lists one running workflow per UID, with the UID in its memo.
func runningWith(t *testing.T, uids ...string) listerFunc {
	return func(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
		resp := &workflowservice.ListWorkflowExecutionsResponse{}
		for _, uid := range uids {
			p, err := converter.GetDefaultDataConverter().ToPayload(map[string]string{"uid": uid})
			require.NoError(t, err)
			resp.Executions = append(resp.Executions, &workflowpb.WorkflowExecutionInfo{Memo: &commonpb.Memo{Fields: map[string]*commonpb.Payload{"proxy": p}}})
		}
		return resp, nil
	}
}

func owned(name, uid, installation string, age time.Duration) provider.Instance {
	return provider.Instance{Name: name, ProviderID: "mem/" + name, CreatedAt: time.Now().Add(-age), Labels: map[string]string{
		provider.LabelProxyUID: uid, provider.LabelInstallation: installation, provider.LabelManagedBy: provider.ManagedByValue,
	}}
}

// TestSweepDeletesExactlyTheOrphansAtAnySize: 2,500 instances over five pages, of every
// kind the sweep must tell apart; only the orphans go, the counts add up, and the result
// names a bounded sample.
func TestSweepDeletesExactlyTheOrphansAtAnySize(t *testing.T) {
	f := newFixture(t)
	live := f.proxy(t, "live")
	mem := &memProvider{instances: map[string]provider.Instance{}, failOn: map[string]bool{}}
	want := map[string]bool{}
	for i := range 500 {
		for _, inst := range []provider.Instance{
			owned(fmt.Sprintf("cr-%d", i), string(live.UID), "test", time.Hour),
			owned(fmt.Sprintf("wf-%d", i), "running-uid", "test", time.Hour),
			owned(fmt.Sprintf("young-%d", i), "gone-uid", "test", time.Minute),
			owned(fmt.Sprintf("orphan-%d", i), fmt.Sprintf("gone-%d", i), "test", time.Hour),
			owned(fmt.Sprintf("theirs-%d", i), "gone-uid", "elsewhere", time.Hour),
		} {
			mem.instances[inst.ProviderID] = inst
		}
		want[fmt.Sprintf("mem/orphan-%d", i)] = true
	}
	mem.failOn["mem/orphan-7"] = true
	delete(want, "mem/orphan-7")
	f.acts.Providers = provider.Registry{v1alpha1.ProviderLocal: mem}
	f.acts.Temporal = runningWith(t, "running-uid")

	res := sweep(t, f, activities.SweepInput{
		Provider: v1alpha1.ProviderLocal, Installation: "test", MinAge: 10 * time.Minute,
		Live: activities.LiveInput{WorkflowQuery: "q", MemoKey: "proxy"},
	})

	got := map[string]bool{}
	for _, id := range mem.deleted {
		got[id] = true
	}
	assert.Equal(t, want, got, "exactly the orphans, and each once")
	assert.Equal(t, 2000, res.Listed, "another installation's instances are not listed")
	assert.Equal(t, 499, res.DeletedCount)
	assert.Equal(t, 1500, res.SparedCount)
	assert.Equal(t, map[string]int{activities.GCReasonLiveProxy: 500, activities.GCReasonLiveRunning: 500, activities.GCReasonTooYoung: 500}, res.SparedBy)
	assert.Equal(t, 1, res.ErrorCount)
	require.Len(t, res.Errors, 1)
	assert.Contains(t, res.Errors[0], "mem/orphan-7")
	assert.Len(t, res.Deleted, activities.SweepSampleSize)
	assert.Len(t, res.Spared, activities.SweepSampleSize)
	b, err := json.Marshal(res)
	require.NoError(t, err)
	assert.Less(t, len(b), 32<<10, "the result does not grow with the fleet")
}

func TestSweepDeletesNothingWithoutTheLiveSet(t *testing.T) {
	f := newFixture(t)
	mem := &memProvider{instances: map[string]provider.Instance{}}
	inst := owned("orphan", "gone", "test", time.Hour)
	mem.instances[inst.ProviderID] = inst
	f.acts.Providers = provider.Registry{v1alpha1.ProviderLocal: mem}
	f.acts.Temporal = listerFunc(func(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
		return nil, errors.New("visibility unavailable")
	})
	_, err := f.env.ExecuteActivity(f.acts.SweepProvider, activities.SweepInput{
		Provider: v1alpha1.ProviderLocal, Installation: "test", MinAge: time.Minute, Live: activities.LiveInput{WorkflowQuery: "q", MemoKey: "proxy"},
	})
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	assert.Equal(t, activities.ErrTypeLiveUnavailable, app.Type())
	assert.Empty(t, mem.deleted)
}

func TestSweepDryRunDeletesNothing(t *testing.T) {
	f := newFixture(t)
	mem := &memProvider{instances: map[string]provider.Instance{}}
	inst := owned("orphan", "gone", "test", time.Hour)
	mem.instances[inst.ProviderID] = inst
	f.acts.Providers = provider.Registry{v1alpha1.ProviderLocal: mem}
	f.acts.Temporal = runningWith(t)
	res := sweep(t, f, activities.SweepInput{
		Provider: v1alpha1.ProviderLocal, Installation: "test", MinAge: time.Minute, DryRun: true, Live: activities.LiveInput{WorkflowQuery: "q", MemoKey: "proxy"},
	})
	assert.Equal(t, 1, res.DeletedCount, "counted as would-delete")
	assert.Empty(t, mem.deleted)
}

// hookProvider is a memProvider whose listing and deletes can be made to do something of
// their own: create a Proxy while the sweep lists, wait for a heartbeat, hang.
type hookProvider struct {
	*memProvider
	onList   func(ctx context.Context)
	onDelete func(ctx context.Context, id string) error
}

func (p *hookProvider) ListOwned(ctx context.Context, owner provider.Owner) ([]provider.Instance, error) {
	if p.onList != nil {
		p.onList(ctx)
	}
	return p.memProvider.ListOwned(ctx, owner)
}

func (p *hookProvider) Delete(ctx context.Context, id string) error {
	if p.onDelete != nil {
		if err := p.onDelete(ctx, id); err != nil {
			return err
		}
	}
	return p.memProvider.Delete(ctx, id)
}

// TestSweepSparesAnInstanceMadeAfterTheLiveSet: the live set is read first, then the
// listing, and a large sweep decides its last pages long after. A Proxy created after the
// live set was read is in neither of its lists; its instance, listed and then judged more
// than the minimum age after it was made, looked orphaned and was deleted. Ages are taken
// at the moment the live set was read, so anything made since is too young to judge.
// (The minimum age here is 1ns, so that the listing's own Kubernetes call outlasts it, as
// a fleet's listing and deletes outlast ten minutes.)
func TestSweepSparesAnInstanceMadeAfterTheLiveSet(t *testing.T) {
	f := newFixture(t)
	mem := &memProvider{instances: map[string]provider.Instance{}}
	hp := &hookProvider{memProvider: mem}
	hp.onList = func(context.Context) {
		made := time.Now()
		late := f.proxy(t, "late") // after the live set was read
		inst := owned("late", string(late.UID), "test", 0)
		inst.CreatedAt = made
		mem.mu.Lock()
		mem.instances[inst.ProviderID] = inst
		mem.mu.Unlock()
	}
	f.acts.Providers = provider.Registry{v1alpha1.ProviderLocal: hp}
	f.acts.Temporal = runningWith(t)
	res := sweep(t, f, activities.SweepInput{
		Provider: v1alpha1.ProviderLocal, Installation: "test", MinAge: time.Nanosecond,
		Live: activities.LiveInput{WorkflowQuery: "q", MemoKey: "proxy"},
	})
	assert.Empty(t, mem.deleted, "the instance of a Proxy made during the sweep is live")
	assert.Equal(t, map[string]int{activities.GCReasonTooYoung: 1}, res.SparedBy)
}

// TestSweepBoundsEachDelete: a delete that hangs is one error after the call timeout, and
// the sweep goes on to the orphans after it. Unbounded, it held the activity without a
// heartbeat until Temporal timed it out, every attempt and every sweep (the order is the
// same each time), so no orphan after it was ever deleted.
func TestSweepBoundsEachDelete(t *testing.T) {
	f := newFixture(t)
	mem := &memProvider{instances: map[string]provider.Instance{}}
	for _, inst := range []provider.Instance{owned("a-hangs", "gone-1", "test", time.Hour), owned("b-orphan", "gone-2", "test", time.Hour)} {
		mem.instances[inst.ProviderID] = inst
	}
	unbounded := false
	hp := &hookProvider{memProvider: mem, onDelete: func(ctx context.Context, id string) error {
		if id != "mem/a-hangs" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second): // the test's own deadline
			unbounded = true
			return errors.New("the delete was not bounded")
		}
	}}
	f.acts.Providers = provider.Registry{v1alpha1.ProviderLocal: hp}
	f.acts.Temporal = runningWith(t)
	f.acts.CallTimeout = 100 * time.Millisecond
	res := sweep(t, f, activities.SweepInput{
		Provider: v1alpha1.ProviderLocal, Installation: "test", MinAge: time.Minute,
		Live: activities.LiveInput{WorkflowQuery: "q", MemoKey: "proxy"},
	})
	assert.False(t, unbounded, "a provider call is bounded by the call timeout")
	assert.Equal(t, []string{"mem/b-orphan"}, mem.deleted)
	assert.Equal(t, 1, res.ErrorCount)
	assert.Equal(t, 1, res.DeletedCount)
}

// TestSweepHeartbeatsWhileListing: the listings come before the first delete, and a
// fleet's take longer than the heartbeat timeout (a minute); without a heartbeat meanwhile
// every attempt timed out before it deleted anything.
func TestSweepHeartbeatsWhileListing(t *testing.T) {
	f := newFixture(t)
	mem := &memProvider{instances: map[string]provider.Instance{}}
	inst := owned("orphan", "gone", "test", time.Hour)
	mem.instances[inst.ProviderID] = inst
	beat := make(chan struct{}, 1)
	f.env.SetOnActivityHeartbeatListener(func(*activity.Info, converter.EncodedValues) {
		select {
		case beat <- struct{}{}:
		default:
		}
	})
	listed := false
	hp := &hookProvider{memProvider: mem, onList: func(ctx context.Context) {
		select {
		case <-beat:
			listed = true
		case <-time.After(10 * time.Second): // the test's own deadline
		}
	}}
	f.acts.Providers = provider.Registry{v1alpha1.ProviderLocal: hp}
	f.acts.Temporal = runningWith(t)
	f.acts.CallTimeout = 100 * time.Millisecond
	_, err := f.env.ExecuteActivity(f.acts.SweepProvider, activities.SweepInput{
		Provider: v1alpha1.ProviderLocal, Installation: "test", MinAge: time.Minute,
		Live: activities.LiveInput{WorkflowQuery: "q", MemoKey: "proxy"},
	})
	require.NoError(t, err)
	assert.True(t, listed, "the sweep heartbeats while the provider lists")
}

// TestSweepDryRunRetryCountsOnce: a dry run deletes nothing, so its retry lists the same
// orphans again; carrying the failed attempt's count over counted each twice.
func TestSweepDryRunRetryCountsOnce(t *testing.T) {
	f := newFixture(t)
	mem := &memProvider{instances: map[string]provider.Instance{}}
	for _, inst := range []provider.Instance{owned("o1", "gone-1", "test", time.Hour), owned("o2", "gone-2", "test", time.Hour)} {
		mem.instances[inst.ProviderID] = inst
	}
	f.acts.Providers = provider.Registry{v1alpha1.ProviderLocal: mem}
	f.acts.Temporal = runningWith(t)
	f.env.SetHeartbeatDetails(activities.SweepResult{Listed: 2, DeletedCount: 1,
		Deleted: []activities.GCItem{{Name: "o1", ProviderID: "mem/o1", Reason: activities.GCReasonOrphan}}, Done: 2})
	res := sweep(t, f, activities.SweepInput{
		Provider: v1alpha1.ProviderLocal, Installation: "test", MinAge: time.Minute, DryRun: true,
		Live: activities.LiveInput{WorkflowQuery: "q", MemoKey: "proxy"},
	})
	assert.Equal(t, 2, res.DeletedCount)
	assert.Len(t, res.Deleted, 2)
	assert.Empty(t, mem.deleted)
}

// TestSweepResultBoundsErrorMessages: a provider's error message is whatever the cloud
// answered; ten of them must not carry the result (and each heartbeat) past the payload
// limit.
func TestSweepResultBoundsErrorMessages(t *testing.T) {
	f := newFixture(t)
	mem := &memProvider{instances: map[string]provider.Instance{}}
	for i := range 20 {
		inst := owned(fmt.Sprintf("o%d", i), "gone", "test", time.Hour)
		mem.instances[inst.ProviderID] = inst
	}
	huge := strings.Repeat("x", 1<<20)
	hp := &hookProvider{memProvider: mem, onDelete: func(context.Context, string) error { return errors.New(huge) }}
	f.acts.Providers = provider.Registry{v1alpha1.ProviderLocal: hp}
	f.acts.Temporal = runningWith(t)
	res := sweep(t, f, activities.SweepInput{
		Provider: v1alpha1.ProviderLocal, Installation: "test", MinAge: time.Minute,
		Live: activities.LiveInput{WorkflowQuery: "q", MemoKey: "proxy"},
	})
	assert.Equal(t, 20, res.ErrorCount)
	b, err := json.Marshal(res)
	require.NoError(t, err)
	assert.Less(t, len(b), 32<<10, "error messages are cut short")
}

// sweep runs SweepProvider to its result, which it requires.
func sweep(t *testing.T, f *fixture, in activities.SweepInput) activities.SweepResult {
	t.Helper()
	v, err := f.env.ExecuteActivity(f.acts.SweepProvider, in)
	require.NoError(t, err)
	var res activities.SweepResult
	require.NoError(t, v.Get(&res))
	return res
}

// TestSweepCountsAnObjectInUseAsKept: the provider declines to delete an orphan that is in
// use again by the time it is asked (a shared firewall rule an instance made since uses):
// the sweep reports it kept, with its reason, not deleted and not failed.
func TestSweepCountsAnObjectInUseAsKept(t *testing.T) {
	f := newFixture(t)
	mem := &memProvider{instances: map[string]provider.Instance{}}
	for _, name := range []string{"rule", "vm"} {
		inst := owned(name, "gone", "test", time.Hour)
		mem.instances[inst.ProviderID] = inst
	}
	hp := &hookProvider{memProvider: mem, onDelete: func(_ context.Context, id string) error {
		if strings.Contains(id, "rule") {
			return fmt.Errorf("firewall rule %s: %w", id, provider.ErrInUse)
		}
		return nil
	}}
	f.acts.Providers = provider.Registry{v1alpha1.ProviderLocal: hp}
	f.acts.Temporal = runningWith(t)
	res := sweep(t, f, activities.SweepInput{
		Provider: v1alpha1.ProviderLocal, Installation: "test", MinAge: time.Minute,
		Live: activities.LiveInput{WorkflowQuery: "q", MemoKey: "proxy"},
	})
	assert.Equal(t, 1, res.DeletedCount, "only the VM is deleted")
	assert.Equal(t, 1, res.SparedBy[activities.GCReasonInUse], "the rule is kept: %+v", res)
	assert.Zero(t, res.ErrorCount)
}
