package activities_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestReviewARestartedRunFindsTheInstanceInTheOldProject: a run that starts without state
// but with a spec (the workflow was terminated, or a server limit ended it, and the
// operator's next spec signal started it again) lists only the spec's project and every
// provider's default. Its Proxy was moved from old-project to spec-project meanwhile (the
// edit came with the restart, or the old run ended mid-replacement). The instance the
// Proxy last published, in old-project, is not found: it is neither adopted nor retired,
// and, since the sweep lists the default project only, it runs (and bills) forever. The
// cleanup run reads the published instance's project for exactly this reason; an
// adopting run needs it just as much (issue 29: "finds ... every project and provider it
// used").
func TestReviewARestartedRunFindsTheInstanceInTheOldProject(t *testing.T) {
	f := newFixture(t)
	p := &v1alpha1.Proxy{}
	p.Namespace, p.Name, p.Finalizers = f.ns, "moved", []string{v1alpha1.Finalizer}
	p.Spec = v1alpha1.ProxySpec{Provider: v1alpha1.ProviderGCP, HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/"},
		GCP: &v1alpha1.GCPSpec{Project: "spec-project", Zone: "europe-west1-b", MachineType: "e2-micro",
			Image: "projects/debian-cloud/global/images/family/debian-12", AllowedSourceRanges: []v1alpha1.CIDR{"203.0.113.0/24"}}}
	require.NoError(t, testenv.Kube(t).Client.Create(context.Background(), p))
	_, err := f.env.ExecuteActivity(f.acts.PublishStatus, activities.PublishInput{Namespace: f.ns, Name: p.Name, UID: string(p.UID),
		Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, ProviderID: "projects/old-project/zones/europe-west1-b/instances/px-m-1"}})
	require.NoError(t, err)

	gcp := &projectLister{byProject: map[string][]provider.Instance{"old-project": {owned("px-m-1", string(p.UID), "test", 0)}}}
	f.acts.Providers = provider.Registry{v1alpha1.ProviderGCP: gcp}
	v, err := f.env.ExecuteActivity(f.acts.FindInstances, activities.FindInput{ProxyUID: string(p.UID), Namespace: f.ns, Name: p.Name,
		Provider: v1alpha1.ProviderGCP, Project: "spec-project"})
	require.NoError(t, err)
	var res activities.FindResult
	require.NoError(t, v.Get(&res))
	var names []string
	for _, o := range res.Instances {
		names = append(names, o.Instance.Name)
	}
	assert.Contains(t, names, "px-m-1", "the instance the Proxy last published was not looked for; asked: %q", gcp.asked)
}
