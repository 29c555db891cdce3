package activities_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	awsprov "github.com/proxyfleet/proxyfleet/activities/provider/aws"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/activities/provider/gcp"
	"github.com/proxyfleet/proxyfleet/activities/provider/gcp/gcptest"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestAnInstanceBeingDeletedIsGone: a VM deleted behind the workflow's back is reported by
// the gcp provider as gone (or, for an instance made before firewall rules were shared,
// whose own rule is still there, as being deleted). Neither a wait for
// it to run nor the monitor's drift check waits for it to vanish; both report it gone, so
// the workflow builds another. The provider runs against the fake Compute API on loopback.
func TestAnInstanceBeingDeletedIsGone(t *testing.T) {
	const project = "test-project"
	srv := gcptest.NewServer(t)
	g, err := gcp.New(t.Context(), gcp.Config{DefaultProject: project, ClientOptions: srv.ClientOptions()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })
	acts := &activities.Activities{Providers: provider.Registry{v1alpha1.ProviderGCP: g}, Installation: "test", Keyring: testKeys(t)}
	var s testsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	env.RegisterActivity(acts)

	spec := v1alpha1.ProxySpec{Provider: v1alpha1.ProviderGCP, GCP: &v1alpha1.GCPSpec{
		Zone: "europe-west1-b", MachineType: "e2-micro", Image: "projects/debian-cloud/global/images/family/debian-12",
		AllowedSourceRanges: []v1alpha1.CIDR{"203.0.113.0/24"},
	}}
	in := activities.InstanceInput{Provider: v1alpha1.ProviderGCP, Name: "px-gone-1", ProxyUID: "uid-gone", Namespace: "ns",
		Spec: spec, PollInterval: 10 * time.Millisecond, MaxWait: time.Hour}
	v, err := env.ExecuteActivity(acts.CreateInstance, in)
	require.NoError(t, err)
	var created activities.CreateResult
	require.NoError(t, v.Get(&created))
	in.ProviderID = created.Instance.ProviderID
	srv.RemoveInstance(project, "europe-west1-b", "px-gone-1")
	require.Len(t, srv.Firewalls(), 1, "the rule stays behind")

	v, err = env.ExecuteActivity(acts.WaitRunning, in)
	require.NoError(t, err)
	var wait activities.WaitResult
	require.NoError(t, v.Get(&wait))
	assert.True(t, wait.Gone)

	// Probes fail (nothing listens at the target): the monitor reports the verdict, and the
	// one that starts next checks the provider first thing and reports the instance gone.
	mon := failingProbes(t, &in, true)
	v, err = env.ExecuteActivity(acts.Monitor, mon)
	require.NoError(t, err)
	var res activities.MonitorResult
	require.NoError(t, v.Get(&res))
	require.Equal(t, activities.MonitorVerdict, res.Reason)
	require.False(t, res.Health.Healthy)
	mon.Last = res.Health
	v, err = env.ExecuteActivity(acts.Monitor, mon)
	require.NoError(t, err)
	require.NoError(t, v.Get(&res))
	assert.Equal(t, activities.MonitorGone, res.Reason)
}

// TestMonitorReportsAPreemption: a Spot VM that GCE took back (the fake's Preempt) is
// reported stopped and preempted by the monitor that starts after the unhealthy verdict,
// and the worker counts it in proxyfleet_preemptions_total{provider="gcp"}.
func TestMonitorReportsAPreemption(t *testing.T) {
	srv := gcptest.NewServer(t)
	g, err := gcp.New(t.Context(), gcp.Config{DefaultProject: "test-project", ClientOptions: srv.ClientOptions()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })
	spec := v1alpha1.ProxySpec{Provider: v1alpha1.ProviderGCP, GCP: &v1alpha1.GCPSpec{
		Zone: "europe-west1-b", MachineType: "e2-micro", Image: "projects/debian-cloud/global/images/family/debian-12",
		AllowedSourceRanges: []v1alpha1.CIDR{"203.0.113.0/24"}, Spot: true,
	}}
	res, preemptions := monitorAfterLoss(t, g, spec, func() { srv.Preempt("px-spot-1") })
	assert.Equal(t, activities.MonitorStopped, res.Reason)
	assert.True(t, res.Instance.Preempted)
	assert.Equal(t, 1.0, preemptions)
}

// monitorAfterLoss creates px-spot-1 of spec with p, calls lose (the cloud takes it back),
// and runs the monitor that starts after an unhealthy verdict: its result, and how many
// preemptions the worker counted.
func monitorAfterLoss(t *testing.T, p provider.Provider, spec v1alpha1.ProxySpec, lose func()) (activities.MonitorResult, float64) {
	t.Helper()
	reg := prometheus.NewRegistry()
	acts := &activities.Activities{Providers: provider.Registry{spec.Provider: p}, Installation: "test", Keyring: testKeys(t),
		Metrics: activities.NewMetrics(reg)}
	var s testsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	env.RegisterActivity(acts)
	in := activities.InstanceInput{Provider: spec.Provider, Name: "px-spot-1", ProxyUID: "uid-spot", Namespace: "ns",
		Spec: spec, PollInterval: 10 * time.Millisecond, MaxWait: time.Hour}
	v, err := env.ExecuteActivity(acts.CreateInstance, in)
	require.NoError(t, err)
	var created activities.CreateResult
	require.NoError(t, v.Get(&created))
	in.ProviderID = created.Instance.ProviderID
	lose()
	v, err = env.ExecuteActivity(acts.Monitor, failingProbes(t, &in, false))
	require.NoError(t, err)
	var res activities.MonitorResult
	require.NoError(t, v.Get(&res))
	return res, metricValue(t, reg, "proxyfleet_preemptions_total")
}

// metricValue sums the series of the metric family called name that reg holds (counters
// and gauges), or -1 without such a family.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		total := 0.0
		for _, m := range f.GetMetric() {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		return total
	}
	return -1
}

// failingProbes is a monitor's input for the instance whose probes all fail (nothing
// listens at the target), one failure being a verdict, starting from a known verdict.
func failingProbes(t *testing.T, in *activities.InstanceInput, healthy bool) activities.MonitorInput {
	return activities.MonitorInput{
		Target: testenv.FreeAddr(t), Instance: in, DriftInterval: time.Hour,
		HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/", Interval: "1s", Timeout: "200ms", SuccessThreshold: 1, FailureThreshold: 1},
		Last:        activities.Health{Known: true, Healthy: healthy},
	}
}

// TestMonitorReportsASpotInterruption: an EC2 Spot instance EC2 took back is terminated,
// not stopped; the monitor reports it gone and preempted (so the Proxy says Preempted and
// the workflow replaces it at once), and the worker counts it under provider="aws".
func TestMonitorReportsASpotInterruption(t *testing.T) {
	srv := ec2test.NewServer(t)
	a, err := awsprov.New(awsprov.Config{AWS: srv.Config()})
	require.NoError(t, err)
	spec := v1alpha1.ProxySpec{Provider: v1alpha1.ProviderAWS, AWS: &v1alpha1.AWSSpec{
		Region: ec2test.Region, AllowedSourceRanges: []v1alpha1.CIDR{"203.0.113.0/24"}, Spot: true}}
	res, preemptions := monitorAfterLoss(t, a, spec, func() { srv.Interrupt(srv.Instances()[0].ID) })
	assert.Equal(t, activities.MonitorGone, res.Reason)
	assert.True(t, res.Instance.Preempted)
	assert.Equal(t, 1.0, preemptions)
}
