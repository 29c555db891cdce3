package activities_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
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

	v, err := f.env.ExecuteActivity(f.acts.SweepProvider, activities.SweepInput{
		Provider: v1alpha1.ProviderLocal, Installation: "test", MinAge: 10 * time.Minute,
		Live: activities.LiveInput{WorkflowQuery: "q", MemoKey: "proxy"},
	})
	require.NoError(t, err)
	var res activities.SweepResult
	require.NoError(t, v.Get(&res))

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
	v, err := f.env.ExecuteActivity(f.acts.SweepProvider, activities.SweepInput{
		Provider: v1alpha1.ProviderLocal, Installation: "test", MinAge: time.Minute, DryRun: true, Live: activities.LiveInput{WorkflowQuery: "q", MemoKey: "proxy"},
	})
	require.NoError(t, err)
	var res activities.SweepResult
	require.NoError(t, v.Get(&res))
	assert.Equal(t, 1, res.DeletedCount, "counted as would-delete")
	assert.Empty(t, mem.deleted)
}
