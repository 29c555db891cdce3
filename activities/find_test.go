package activities_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/ptr"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// projectLister is a provider with projects: it lists the instances of the project an
// owner names ("" is its default), and can be down.
type projectLister struct {
	provider.Provider
	byProject map[string][]provider.Instance
	down      bool
	asked     []string
}

func (p *projectLister) ListOwned(_ context.Context, owner provider.Owner) ([]provider.Instance, error) {
	p.asked = append(p.asked, owner.Project)
	if p.down {
		return nil, errors.New("503 backend unavailable")
	}
	return p.byProject[owner.Project], nil
}

// movedProxy creates a GCP Proxy whose spec names spec-project, and publishes its instance
// as one in old-project: a Proxy moved while its instance still runs where it was.
func (f *fixture) movedProxy(t *testing.T, name, instance string) *v1alpha1.Proxy {
	t.Helper()
	p := &v1alpha1.Proxy{}
	p.Namespace, p.Name, p.Finalizers = f.ns, name, []string{v1alpha1.Finalizer}
	p.Spec = v1alpha1.ProxySpec{Provider: v1alpha1.ProviderGCP, HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/"},
		GCP: &v1alpha1.GCPSpec{Project: "spec-project", Zone: "europe-west1-b", MachineType: "e2-micro",
			Image: "projects/debian-cloud/global/images/family/debian-12", AllowedSourceRanges: []v1alpha1.CIDR{"203.0.113.0/24"}}}
	require.NoError(t, testenv.Kube(t).Client.Create(context.Background(), p))
	_, err := f.env.ExecuteActivity(f.acts.PublishStatus, activities.PublishInput{Namespace: f.ns, Name: p.Name, UID: string(p.UID),
		Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, ProviderID: "projects/old-project/zones/europe-west1-b/instances/" + instance}})
	require.NoError(t, err)
	return p
}

// found runs FindInstances and returns the names of the instances it found.
func (f *fixture) found(t *testing.T, in activities.FindInput) []string {
	t.Helper()
	v, err := f.env.ExecuteActivity(f.acts.FindInstances, in)
	require.NoError(t, err)
	var res activities.FindResult
	require.NoError(t, v.Get(&res))
	var names []string
	for _, o := range res.Instances {
		names = append(names, o.Instance.Name)
	}
	return names
}

// TestACleanupRunFindsWhereTheInstancesAre: a run started for the delete alone has no spec;
// it reads the Proxy (kept by its finalizer) and lists the spec's project and the project
// of the last instance published, not only the provider's default project.
func TestACleanupRunFindsWhereTheInstancesAre(t *testing.T) {
	f := newFixture(t)
	p := f.movedProxy(t, "elsewhere", "px-a-1")

	inst := func(name string) provider.Instance { return owned(name, string(p.UID), "test", 0) }
	gcp := &projectLister{byProject: map[string][]provider.Instance{
		"spec-project": {inst("px-a-2")}, "old-project": {inst("px-a-1")},
	}}
	f.acts.Providers = provider.Registry{v1alpha1.ProviderGCP: gcp}
	names := f.found(t, activities.FindInput{ProxyUID: string(p.UID), Namespace: f.ns, Name: p.Name})
	assert.ElementsMatch(t, []string{"px-a-1", "px-a-2"}, names, "asked: %q", gcp.asked)
	assert.ElementsMatch(t, []string{"", "spec-project", "old-project"}, gcp.asked)
}

// TestACleanupRunWaitsOutAnOutage: a cleanup run must not release the finalizer on a
// partial answer, so every provider must answer; a run with a spec still goes on past an
// outage at a provider that is not its own.
func TestACleanupRunWaitsOutAnOutage(t *testing.T) {
	f := newFixture(t)
	p := f.proxy(t, "outage")
	gcp := &projectLister{down: true}
	local := &projectLister{byProject: map[string][]provider.Instance{"": {owned("px-b-1", string(p.UID), "test", 0)}}}
	f.acts.Providers = provider.Registry{v1alpha1.ProviderGCP: gcp, v1alpha1.ProviderLocal: local}

	_, err := f.env.ExecuteActivity(f.acts.FindInstances, activities.FindInput{ProxyUID: string(p.UID), Namespace: f.ns, Name: p.Name})
	require.Error(t, err, "a cleanup run does not skip a provider that failed")
	assert.Contains(t, err.Error(), "503")

	v, err := f.env.ExecuteActivity(f.acts.FindInstances, activities.FindInput{ProxyUID: string(p.UID), Namespace: f.ns, Name: p.Name,
		Provider: v1alpha1.ProviderLocal})
	require.NoError(t, err, "a run with a spec: another provider's outage is skipped")
	var res activities.FindResult
	require.NoError(t, v.Get(&res))
	require.Len(t, res.Instances, 1)
}

// TestACleanupRunFindsAnAWSProxysRegions: for aws the "project" is a region. A cleanup
// run lists the spec's region and the region of the instance last published, beside the
// worker's own; a kubernetes-looking provider ID (<namespace>/<name>) of a Proxy that is
// not aws is never read as a region.
func TestACleanupRunFindsAnAWSProxysRegions(t *testing.T) {
	f := newFixture(t)
	p := &v1alpha1.Proxy{}
	p.Namespace, p.Name, p.Finalizers = f.ns, "moved-region", []string{v1alpha1.Finalizer}
	p.Spec = v1alpha1.ProxySpec{Provider: v1alpha1.ProviderAWS, HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/"},
		AWS: &v1alpha1.AWSSpec{Region: "eu-west-2", AssociatePublicIP: ptr.To(false)}}
	require.NoError(t, testenv.Kube(t).Client.Create(context.Background(), p))
	_, err := f.env.ExecuteActivity(f.acts.PublishStatus, activities.PublishInput{Namespace: f.ns, Name: p.Name, UID: string(p.UID),
		Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, InstanceName: "px-c-1", ProviderID: "us-east-1/px-c-1/i-0123456789abcdef0/1764748800"}})
	require.NoError(t, err)

	inst := func(name string) provider.Instance { return owned(name, string(p.UID), "test", 0) }
	aws := &projectLister{byProject: map[string][]provider.Instance{"eu-west-2": {inst("px-c-2")}, "us-east-1": {inst("px-c-1")}}}
	kube := &projectLister{}
	f.acts.Providers = provider.Registry{v1alpha1.ProviderAWS: aws, v1alpha1.ProviderKubernetes: kube}
	names := f.found(t, activities.FindInput{ProxyUID: string(p.UID), Namespace: f.ns, Name: p.Name})
	assert.ElementsMatch(t, []string{"px-c-1", "px-c-2"}, names, "asked: %q", aws.asked)
	assert.ElementsMatch(t, []string{"", "eu-west-2", "us-east-1"}, aws.asked)
	assert.Equal(t, []string{""}, kube.asked)
	v, err := f.env.ExecuteActivity(f.acts.FindInstances, activities.FindInput{ProxyUID: string(p.UID), Namespace: f.ns, Name: p.Name,
		Provider: v1alpha1.ProviderAWS, Project: "eu-west-2"})
	require.NoError(t, err)
	var res activities.FindResult
	require.NoError(t, v.Get(&res))
	assert.Equal(t, "px-c-1", res.Published, "the instance last published, for the run's counter")

	// A Proxy of another provider whose provider ID reads like a region's (a kubernetes
	// pod in a namespace named us-east-1).
	k := f.proxy(t, "pod-in-us-east-1")
	_, err = f.env.ExecuteActivity(f.acts.PublishStatus, activities.PublishInput{Namespace: f.ns, Name: k.Name, UID: string(k.UID),
		Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, ProviderID: "us-east-1/px-d-1"}})
	require.NoError(t, err)
	aws.asked = nil
	f.found(t, activities.FindInput{ProxyUID: string(k.UID), Namespace: f.ns, Name: k.Name})
	assert.Equal(t, []string{""}, aws.asked)
}
