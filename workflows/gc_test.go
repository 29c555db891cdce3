package workflows

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
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

func orphanAt(name, uid string) provider.Instance {
	return provider.Instance{Name: name, ProviderID: "id/" + name, CreatedAt: time.Now().Add(-time.Hour),
		Labels: map[string]string{provider.LabelProxyUID: uid, provider.LabelInstallation: "mine"}}
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
	env.OnActivity(acts.ListLiveUIDs, mock.Anything, mock.Anything).Return(activities.LiveUIDs{}, errors.New("forbidden"))
	env.ExecuteWorkflow(GCWorkflow, GCInput{Installation: "mine", Providers: []v1alpha1.Provider{"local"}})
	res := gcResult(t, env)
	assert.True(t, res.Skipped)
	assert.Contains(t, res.SkipReason, "forbidden")
	env.AssertNotCalled(t, "ListInstances", mock.Anything, mock.Anything)
	env.AssertNotCalled(t, "DeleteOrphan", mock.Anything, mock.Anything)
}

func TestGCRefusesAPartialView(t *testing.T) {
	env, _ := gcEnv(t)
	env.ExecuteWorkflow(GCWorkflow, GCInput{Installation: "mine", Providers: []v1alpha1.Provider{"local"}, Namespaces: []string{"team-a"}})
	res := gcResult(t, env)
	assert.True(t, res.Skipped)
	assert.Contains(t, res.SkipReason, "team-a")
}

func TestGCProviderErrorDoesNotStopTheOthers(t *testing.T) {
	env, acts := gcEnv(t)
	env.OnActivity(acts.ListLiveUIDs, mock.Anything, mock.Anything).Return(activities.LiveUIDs{Proxies: []string{"live"}}, nil)
	env.OnActivity(acts.ListInstances, mock.Anything, activities.ListInput{Provider: "gcp", Installation: "mine"}).
		Return(nil, errors.New("gcp is down"))
	env.OnActivity(acts.ListInstances, mock.Anything, activities.ListInput{Provider: "local", Installation: "mine"}).
		Return([]provider.Instance{orphanAt("o1", "gone"), orphanAt("l1", "live")}, nil)
	var deleted []string
	env.OnActivity(acts.DeleteOrphan, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.OrphanInput) error {
		deleted = append(deleted, in.ProviderID)
		return nil
	})
	env.ExecuteWorkflow(GCWorkflow, GCInput{Installation: "mine", Providers: []v1alpha1.Provider{"gcp", "local"}, MinAge: time.Minute})
	res := gcResult(t, env)
	assert.False(t, res.Skipped)
	assert.Equal(t, []string{"id/o1"}, deleted)
	require.Len(t, res.Deleted, 1)
	assert.Equal(t, "gone", res.Deleted[0].UID)
	require.Len(t, res.Spared, 1)
	assert.Equal(t, GCReasonLiveProxy, res.Spared[0].Reason)
	require.Len(t, res.Errors, 1)
	assert.Contains(t, res.Errors[0], "gcp is down")
}

func TestGCDryRunDeletesNothing(t *testing.T) {
	env, acts := gcEnv(t)
	env.OnActivity(acts.ListLiveUIDs, mock.Anything, mock.Anything).Return(activities.LiveUIDs{}, nil)
	env.OnActivity(acts.ListInstances, mock.Anything, mock.Anything).Return([]provider.Instance{orphanAt("o1", "gone")}, nil)
	env.ExecuteWorkflow(GCWorkflow, GCInput{Installation: "mine", Providers: []v1alpha1.Provider{"local"}, DryRun: true, MinAge: time.Minute})
	res := gcResult(t, env)
	assert.True(t, res.DryRun)
	require.Len(t, res.Deleted, 1, "reported as would-delete")
	env.AssertNotCalled(t, "DeleteOrphan", mock.Anything, mock.Anything)
}
