package workflows

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

func TestDecideGC(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	old := now.Add(-time.Hour)
	inst := func(name, uid, installation string, created time.Time) provider.Instance {
		labels := map[string]string{}
		if uid != "" {
			labels[provider.LabelProxyUID] = uid
		}
		if installation != "" {
			labels[provider.LabelInstallation] = installation
		}
		return provider.Instance{Name: name, ProviderID: "id/" + name, CreatedAt: created, Labels: labels}
	}
	live := activities.LiveUIDs{Proxies: []string{"live-cr", "deleting-cr"}, Workflows: []string{"running-wf"}}
	cases := []struct {
		name   string
		inst   provider.Instance
		reason string
		del    bool
	}{
		{"no ownership label", inst("a", "", "", old), GCReasonNoOwner, false},
		{"uid but no installation label", inst("a", "x", "", old), GCReasonNoOwner, false},
		{"another installation", inst("a", "orphan", "other", old), GCReasonOther, false},
		{"too young", inst("a", "orphan", "mine", now.Add(-time.Minute)), GCReasonTooYoung, false},
		{"unknown creation time", inst("a", "orphan", "mine", time.Time{}), GCReasonTooYoung, false},
		{"live CR", inst("a", "live-cr", "mine", old), GCReasonLiveProxy, false},
		{"CR being deleted still counts as live", inst("a", "deleting-cr", "mine", old), GCReasonLiveProxy, false},
		{"running workflow", inst("a", "running-wf", "mine", old), GCReasonLiveRunning, false},
		{"orphan", inst("a", "orphan", "mine", old), GCReasonOrphan, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			del, spare := decideGC([]provider.Instance{tc.inst}, v1alpha1.ProviderLocal, live, "mine", 10*time.Minute, now)
			if tc.del {
				require.Len(t, del, 1)
				assert.Empty(t, spare)
				assert.Equal(t, tc.reason, del[0].Reason)
				assert.Equal(t, "id/a", del[0].ProviderID)
				return
			}
			assert.Empty(t, del)
			require.Len(t, spare, 1)
			assert.Equal(t, tc.reason, spare[0].Reason)
		})
	}
}

// gcEnv runs GCWorkflow with its activities mocked.
func gcEnv(t *testing.T) (*testsuite.TestWorkflowEnvironment, *activities.Activities) {
	t.Helper()
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	acts := &activities.Activities{}
	env.RegisterActivity(acts)
	return env, acts
}

func gcResult(t *testing.T, env *testsuite.TestWorkflowEnvironment) GCResult {
	t.Helper()
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var res GCResult
	require.NoError(t, env.GetWorkflowResult(&res))
	return res
}

func TestGCSkipsWhenLiveListFails(t *testing.T) {
	env, acts := gcEnv(t)
	env.OnActivity(acts.SweepProvider, mock.Anything, mock.Anything).
		Return(activities.SweepResult{}, temporal.NewApplicationError("list proxies: forbidden", activities.ErrTypeLiveUnavailable))
	env.ExecuteWorkflow(GCWorkflow, GCInput{Installation: "mine", Providers: []v1alpha1.Provider{"gcp", "local"}})
	res := gcResult(t, env)
	assert.True(t, res.Skipped)
	assert.Contains(t, res.SkipReason, "forbidden")
	env.AssertNumberOfCalls(t, "SweepProvider", 3) // one provider, its three attempts: then nothing else is swept
}

func TestGCRefusesAPartialView(t *testing.T) {
	env, _ := gcEnv(t)
	env.ExecuteWorkflow(GCWorkflow, GCInput{Installation: "mine", Providers: []v1alpha1.Provider{"local"}, Namespaces: []string{"team-a"}})
	res := gcResult(t, env)
	assert.True(t, res.Skipped)
	assert.Contains(t, res.SkipReason, "team-a")
}

// TestGCProviderErrorDoesNotStopTheOthers: one provider's failure is an error in the
// result; the others' counts and samples add up.
func TestGCProviderErrorDoesNotStopTheOthers(t *testing.T) {
	env, acts := gcEnv(t)
	env.OnActivity(acts.SweepProvider, mock.Anything, mock.MatchedBy(func(in activities.SweepInput) bool { return in.Provider == "gcp" })).
		Return(activities.SweepResult{}, temporal.NewApplicationError("list gcp: 503", activities.ErrTypeListFailed))
	env.OnActivity(acts.SweepProvider, mock.Anything, mock.MatchedBy(func(in activities.SweepInput) bool { return in.Provider == "local" })).
		Return(func(_ context.Context, in activities.SweepInput) (activities.SweepResult, error) {
			assert.Equal(t, time.Minute, in.MinAge)
			assert.Equal(t, "mine", in.Installation)
			assert.NotEmpty(t, in.Live.WorkflowQuery)
			return activities.SweepResult{Listed: 3, DeletedCount: 1, Deleted: []GCItem{{Name: "o1", UID: "gone", Reason: GCReasonOrphan}},
				SparedCount: 2, SparedBy: map[string]int{GCReasonLiveProxy: 2}, Spared: []GCItem{{Name: "l1", Reason: GCReasonLiveProxy}}}, nil
		})
	env.ExecuteWorkflow(GCWorkflow, GCInput{Installation: "mine", Providers: []v1alpha1.Provider{"gcp", "local"}, MinAge: time.Minute})
	res := gcResult(t, env)
	assert.False(t, res.Skipped)
	assert.Equal(t, 1, res.DeletedCount)
	require.Len(t, res.Deleted, 1)
	assert.Equal(t, "gone", res.Deleted[0].UID)
	assert.Equal(t, 2, res.SparedCount)
	assert.Equal(t, map[string]int{GCReasonLiveProxy: 2}, res.SparedBy)
	require.Len(t, res.Errors, 1)
	assert.Contains(t, res.Errors[0], "503")
	assert.Equal(t, 1, res.ErrorCount)
}

func TestGCDryRunIsPassedOn(t *testing.T) {
	env, acts := gcEnv(t)
	env.OnActivity(acts.SweepProvider, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.SweepInput) (activities.SweepResult, error) {
		assert.True(t, in.DryRun)
		return activities.SweepResult{DeletedCount: 1, Deleted: []GCItem{{Name: "o1"}}}, nil
	})
	env.ExecuteWorkflow(GCWorkflow, GCInput{Installation: "mine", Providers: []v1alpha1.Provider{"local"}, DryRun: true, MinAge: time.Minute})
	res := gcResult(t, env)
	assert.True(t, res.DryRun)
	assert.Equal(t, 1, res.DeletedCount, "reported as would-delete")
}

// TestGCResultIsBoundedWhateverTheFleet: counts grow with the fleet, the result does not.
func TestGCResultIsBoundedWhateverTheFleet(t *testing.T) {
	env, acts := gcEnv(t)
	sample := make([]GCItem, activities.SweepSampleSize)
	for i := range sample {
		sample[i] = GCItem{Name: strings.Repeat("x", 63), ProviderID: strings.Repeat("y", 200), UID: strings.Repeat("z", 36), Reason: GCReasonOrphan}
	}
	errs := make([]string, activities.SweepMaxErrors)
	for i := range errs {
		errs[i] = strings.Repeat("e", 500)
	}
	env.OnActivity(acts.SweepProvider, mock.Anything, mock.Anything).Return(activities.SweepResult{
		Listed: 20000, DeletedCount: 10000, Deleted: sample, SparedCount: 10000, Spared: sample,
		SparedBy: map[string]int{GCReasonTooYoung: 10000}, ErrorCount: 500, Errors: errs,
	}, nil)
	providers := []v1alpha1.Provider{"gcp", "kubernetes", "local"}
	env.ExecuteWorkflow(GCWorkflow, GCInput{Installation: "mine", Providers: providers})
	res := gcResult(t, env)
	assert.Equal(t, 30000, res.DeletedCount)
	assert.Equal(t, 1500, res.ErrorCount)
	assert.LessOrEqual(t, len(res.Errors), activities.SweepMaxErrors)
	b, err := json.Marshal(res)
	require.NoError(t, err)
	assert.Less(t, len(b), 64<<10, "the result is far below the payload limit")
}

// TestGCResultBoundsAProviderFailure: a provider's failure message is whatever its API
// answered; the result keeps a bounded part of it.
func TestGCResultBoundsAProviderFailure(t *testing.T) {
	env, acts := gcEnv(t)
	env.OnActivity(acts.SweepProvider, mock.Anything, mock.Anything).
		Return(activities.SweepResult{}, temporal.NewNonRetryableApplicationError(strings.Repeat("x", 1<<20), activities.ErrTypeListFailed, nil))
	env.ExecuteWorkflow(GCWorkflow, GCInput{Installation: "mine", Providers: []v1alpha1.Provider{"gcp", "kubernetes", "local"}})
	res := gcResult(t, env)
	assert.Equal(t, 3, res.ErrorCount)
	b, err := json.Marshal(res)
	require.NoError(t, err)
	assert.Less(t, len(b), 64<<10, "the result is far below the payload limit")
}

// TestGCLiveSetLostMidSweepIsPartial: a live-set failure after a provider was swept leaves
// the next provider for the next sweep and says so; the sweep is not reported skipped,
// since the first provider's orphans were deleted.
func TestGCLiveSetLostMidSweepIsPartial(t *testing.T) {
	env, acts := gcEnv(t)
	env.OnActivity(acts.SweepProvider, mock.Anything, mock.MatchedBy(func(in activities.SweepInput) bool { return in.Provider == "gcp" })).
		Return(activities.SweepResult{DeletedCount: 2, Deleted: []GCItem{{Name: "o1"}, {Name: "o2"}}}, nil)
	env.OnActivity(acts.SweepProvider, mock.Anything, mock.MatchedBy(func(in activities.SweepInput) bool { return in.Provider == "local" })).
		Return(activities.SweepResult{}, temporal.NewApplicationError("list proxies: forbidden", activities.ErrTypeLiveUnavailable))
	env.ExecuteWorkflow(GCWorkflow, GCInput{Installation: "mine", Providers: []v1alpha1.Provider{"gcp", "local"}})
	res := gcResult(t, env)
	assert.False(t, res.Skipped)
	assert.Equal(t, 2, res.DeletedCount)
	require.Len(t, res.Errors, 1)
	assert.Contains(t, res.Errors[0], "local: not swept")
}
