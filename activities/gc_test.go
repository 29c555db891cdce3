package activities_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// planted are the credentials of instances a test creates behind the activities' back.
var planted = proxyauth.Credentials{Username: proxyauth.ManagedUsername, Password: "planted"}

// A workflow run that starts with no state lists its Proxy's instances by UID and reads the
// spec hash each was built from; the sweeper lists the whole installation.
func TestListInstancesOfOneProxy(t *testing.T) {
	m := newMonitorEnv(t) // a local daemon; this installation is "test"
	env := m.NewTestActivityEnvironment()
	env.RegisterActivity(m.acts)
	spec := v1alpha1.ProxySpec{Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}}

	for _, in := range []activities.InstanceInput{
		{Provider: v1alpha1.ProviderLocal, Name: "px-a-1", ProxyUID: "uid-a", Namespace: "ns", Spec: spec, SpecHash: "0123456789abcdef"},
		{Provider: v1alpha1.ProviderLocal, Name: "px-a-2", ProxyUID: "uid-a", Namespace: "ns", Spec: spec},
		{Provider: v1alpha1.ProviderLocal, Name: "px-b-1", ProxyUID: "uid-b", Namespace: "ns", Spec: spec, SpecHash: "fedcba9876543210"},
	} {
		_, err := env.ExecuteActivity(m.acts.CreateInstance, in)
		require.NoError(t, err, in.Name)
	}
	// The same UID in another installation is not this Proxy's.
	_, err := m.prov.Create(context.Background(), provider.CreateRequest{
		Name: "px-a-9", ProxyUID: "uid-a", Installation: "elsewhere", Namespace: "ns", Spec: spec, Credentials: planted,
	})
	require.NoError(t, err)

	list := func(in activities.ListInput) map[string]provider.Instance {
		t.Helper()
		v, err := env.ExecuteActivity(m.acts.ListInstances, in)
		require.NoError(t, err)
		var got []provider.Instance
		require.NoError(t, v.Get(&got))
		byName := map[string]provider.Instance{}
		for _, inst := range got {
			byName[inst.Name] = inst
		}
		return byName
	}

	mine := list(activities.ListInput{Provider: v1alpha1.ProviderLocal, Installation: "test", ProxyUID: "uid-a"})
	require.Len(t, mine, 2)
	assert.Contains(t, mine, "px-a-1")
	assert.Contains(t, mine, "px-a-2")
	assert.Equal(t, "0123456789abcdef", mine["px-a-1"].Labels[provider.LabelSpecHash], "CreateInstance passes the hash on")
	assert.NotContains(t, mine["px-a-2"].Labels, provider.LabelSpecHash, "no hash, no label")

	all := list(activities.ListInput{Provider: v1alpha1.ProviderLocal, Installation: "test"})
	assert.Len(t, all, 3, "without a UID the whole installation is listed")
	assert.Equal(t, "fedcba9876543210", all["px-b-1"].Labels[provider.LabelSpecHash])

	_, err = env.ExecuteActivity(m.acts.ListInstances, activities.ListInput{Provider: v1alpha1.ProviderLocal, ProxyUID: "uid-a"})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr, "nobody's instances are never listed")
	assert.Equal(t, activities.ErrTypePermanent, appErr.Type())
	assert.True(t, appErr.NonRetryable())
}

// failingLister is a provider whose list always fails, as a cloud in an outage.
type failingLister struct{ provider.Provider }

func (failingLister) ListOwned(context.Context, provider.Owner) ([]provider.Instance, error) {
	return nil, errors.New("503 backend unavailable")
}

// TestFindInstancesAsksTheSpecsProviderFirst: the spec's provider must answer (a partial
// answer could leak an instance), another provider's outage is skipped, and a worker
// without the spec's provider answers with a retryable error.
func TestFindInstancesAsksTheSpecsProviderFirst(t *testing.T) {
	m := newMonitorEnv(t) // a local daemon
	env := m.NewTestActivityEnvironment()
	m.acts.Providers = provider.Registry{v1alpha1.ProviderLocal: m.prov, v1alpha1.ProviderGCP: failingLister{}}
	env.RegisterActivity(m.acts)
	_, err := m.prov.Create(context.Background(), provider.CreateRequest{Name: "px-f-1", ProxyUID: "uid-f", Installation: "test", Credentials: planted,
		Spec: v1alpha1.ProxySpec{Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}}})
	require.NoError(t, err)

	v, err := env.ExecuteActivity(m.acts.FindInstances, activities.FindInput{ProxyUID: "uid-f", Provider: v1alpha1.ProviderLocal})
	require.NoError(t, err, "gcp's outage does not stop a local Proxy")
	var res activities.FindResult
	require.NoError(t, v.Get(&res))
	require.Len(t, res.Instances, 1)
	assert.Equal(t, "px-f-1", res.Instances[0].Instance.Name)

	_, err = env.ExecuteActivity(m.acts.FindInstances, activities.FindInput{ProxyUID: "uid-f", Provider: v1alpha1.ProviderGCP})
	require.Error(t, err, "the spec's own provider must answer")

	_, err = env.ExecuteActivity(m.acts.FindInstances, activities.FindInput{ProxyUID: "uid-f", Provider: v1alpha1.ProviderKubernetes})
	require.Error(t, err)
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		assert.False(t, appErr.NonRetryable(), "a worker without the provider: another may have it")
	}
}
