package registry

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

func TestParseNames(t *testing.T) {
	got, err := ParseNames(" local, kubernetes,,local ")
	require.NoError(t, err)
	assert.Equal(t, []v1alpha1.Provider{v1alpha1.ProviderLocal, v1alpha1.ProviderKubernetes}, got)

	got, err = ParseNames("")
	require.NoError(t, err)
	assert.Empty(t, got)

	_, err = ParseNames("local,azure")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"azure" is not available`)
	assert.Contains(t, err.Error(), "aws, gcp, kubernetes, local", "the error lists what is available")
}

// TestBuild: each provider is built from its own settings, and one that cannot work is
// refused with a reason before the worker starts, not at its first activity.
func TestBuild(t *testing.T) {
	reg, release, err := Build(context.Background(), Config{Enabled: []v1alpha1.Provider{v1alpha1.ProviderLocal}, LocalDaemonURL: "http://127.0.0.1:1"})
	require.NoError(t, err)
	defer release()
	p, err := reg.Get(v1alpha1.ProviderLocal)
	require.NoError(t, err)
	assert.NotNil(t, p)
	_, err = reg.Get(v1alpha1.ProviderGCP)
	assert.ErrorContains(t, err, "not configured on this worker")
	assert.Equal(t, provider.KindTransient, provider.Class(err), "during a rolling change of --providers another worker may have it")

	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"gcp without a project", Config{Enabled: []v1alpha1.Provider{v1alpha1.ProviderGCP}}, "--gcp-project"},
		{"kubernetes without a client", Config{Enabled: []v1alpha1.Provider{v1alpha1.ProviderKubernetes}}, "Kubernetes client"},
		{"unknown", Config{Enabled: []v1alpha1.Provider{"azure"}}, `"azure" is not available`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Build(context.Background(), tc.cfg)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
