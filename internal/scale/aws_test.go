package scale_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	awsprov "github.com/proxyfleet/proxyfleet/activities/provider/aws"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/activities/provider/registry"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
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

	res := sweep(ctx, t, installation, registry.Config{Enabled: []v1alpha1.Provider{v1alpha1.ProviderAWS},
		AWS: awsprov.Config{AWS: srv.Config(), Regions: []string{other}}})
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
