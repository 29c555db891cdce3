package scale_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	awsprov "github.com/proxyfleet/proxyfleet/activities/provider/aws"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/activities/provider/registry"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/worker"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestGCSweeps20000AWSInstances: an installation of 20,000 EC2 instances in two regions,
// 5,000 of them orphans, swept by GCWorkflow on a real worker through the SDK's paginator
// (1,000 a page): every orphan goes, nothing else does, and no payload of the sweep comes
// near the limit.
func TestGCSweeps20000AWSInstances(t *testing.T) {
	const total, orphans = 20000, 5000
	const installation, other = "scale-aws", "us-east-1"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tenv := testenv.Temporal(t)
	srv := ec2test.NewServer(t)
	old := time.Now().Add(-time.Hour)
	for i := range total {
		name := fmt.Sprintf("px-%016d-1", i)
		in := ec2test.Instance{ClientToken: name, LaunchTime: time.Now(), Tags: map[string]string{
			provider.LabelInstallation: installation, provider.LabelProxyUID: fmt.Sprintf("%08d-0000-4000-8000-000000000000", i),
			provider.LabelManagedBy: provider.ManagedByValue, "proxyfleet-instance": name, "Name": name}}
		if i%(total/orphans) == 0 { // old enough to be swept; the rest are mid-create
			in.LaunchTime = old
		}
		region := srv
		if i%5 < 2 { // two fifths, orphans among them
			region = srv.InRegion(other)
		}
		region.AddInstance(in)
	}

	queue := "scale-aws-" + fmt.Sprint(time.Now().UnixNano())
	w, err := worker.New(ctx, worker.Config{
		TaskQueue: queue, Installation: installation, MonitorShards: 1,
		Providers: registry.Config{Enabled: []v1alpha1.Provider{v1alpha1.ProviderAWS},
			AWS: awsprov.Config{AWS: srv.Config(), Regions: []string{other}}},
	}, tenv.Client, testenv.Kube(t).Client, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(w.Stop)

	run, err := tenv.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: queue, ID: "gc-" + queue},
		contract.GCWorkflowType, workflows.GCInput{Installation: installation, Providers: []v1alpha1.Provider{v1alpha1.ProviderAWS}, MinAge: 10 * time.Minute})
	require.NoError(t, err)
	var res workflows.GCResult
	require.NoError(t, run.Get(ctx, &res), "the sweep completes: no payload of it is over the limit")
	assert.False(t, res.Skipped, res.SkipReason)
	assert.Equal(t, orphans, res.DeletedCount)
	assert.Equal(t, total-orphans, res.SparedCount)
	assert.Empty(t, res.Errors)
	assert.LessOrEqual(t, len(res.Deleted), 20)
	left := 0
	for _, r := range []*ec2test.Server{srv, srv.InRegion(other)} {
		for _, in := range r.Instances() {
			if in.State == "running" {
				left++
				assert.False(t, in.LaunchTime.Equal(old), "%s was an orphan", in.ID)
			}
		}
	}
	assert.Equal(t, total-orphans, left)
	assert.Positive(t, srv.InRegion(other).Requests(ec2test.ActionTerminateInstances), "orphans in the other region went too")
}
