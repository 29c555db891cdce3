package activities_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// tearingDown is a provider whose every instance is being deleted: a pod someone deleted,
// or a VM that is gone while its firewall rule is still there.
type tearingDown struct{ provider.Provider }

func (tearingDown) Get(_ context.Context, id string) (provider.Instance, error) {
	return provider.Instance{Name: "px-x-1", ProviderID: id, State: provider.StateDeleting}, nil
}

func (tearingDown) ProviderID(req provider.CreateRequest) string {
	return "zones/z/instances/" + req.Name
}

// TestAnInstanceBeingDeletedIsGone: neither a wait for it to run nor the monitor's drift
// check waits for it to vanish; both report it gone, so the workflow builds another.
func TestAnInstanceBeingDeletedIsGone(t *testing.T) {
	acts := &activities.Activities{Providers: provider.Registry{v1alpha1.ProviderGCP: tearingDown{}}, Installation: "test", Keyring: testKeys(t)}
	var s testsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	env.RegisterActivity(acts)
	in := activities.InstanceInput{Provider: v1alpha1.ProviderGCP, Name: "px-x-1", ProviderID: "zones/z/instances/px-x-1",
		PollInterval: 10 * time.Millisecond, MaxWait: time.Hour}

	v, err := env.ExecuteActivity(acts.WaitRunning, in)
	require.NoError(t, err)
	var wait activities.WaitResult
	require.NoError(t, v.Get(&wait))
	assert.True(t, wait.Gone)

	// The monitor checks the provider as soon as probes fail (nothing listens at the
	// target), and reports the instance gone.
	mon := activities.MonitorInput{
		Target: testenv.FreeAddr(t), Instance: &in, DriftInterval: time.Hour,
		HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/", Interval: "1s", Timeout: "200ms", SuccessThreshold: 1, FailureThreshold: 1},
		Last:        activities.Health{Known: true, Healthy: true},
	}
	v, err = env.ExecuteActivity(acts.Monitor, mon)
	require.NoError(t, err)
	var res activities.MonitorResult
	require.NoError(t, v.Get(&res))
	assert.Equal(t, activities.MonitorGone, res.Reason)
}
