// Package scale_test runs the parts of the system whose payloads could grow with the fleet
// at fleet scale, against the fakes, on a Temporal dev server whose blob-size limit is
// 128 KiB, a sixteenth of the production default (2 MiB): an activity input or result,
// signal or memo that grows with the number of instances fails here long before it would
// fail a real fleet, and fails the test.
package scale_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/gcp"
	"github.com/proxyfleet/proxyfleet/activities/provider/gcp/gcptest"
	"github.com/proxyfleet/proxyfleet/activities/provider/registry"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/worker"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// blobLimit is the dev server's limit.blobSize.error for this package.
const blobLimit = 128 << 10

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{Temporal: true, Kube: true, TemporalArgs: []string{
		"--dynamic-config-value", fmt.Sprintf("limit.blobSize.error=%d", blobLimit),
		"--dynamic-config-value", fmt.Sprintf("limit.blobSize.warn=%d", blobLimit/2),
	}}))
}

// TestTheBlobLimitIsInForce: a payload over the limit is refused, so the tests below would
// see one that grows with the fleet.
func TestTheBlobLimitIsInForce(t *testing.T) {
	tc := testenv.Temporal(t).Client
	_, err := tc.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{TaskQueue: "nobody-polls", ID: "too-large"},
		contract.GCWorkflowType, strings.Repeat("x", blobLimit+1))
	require.Error(t, err)
	assert.Contains(t, strings.ToLower(err.Error()), "size")
}

// TestGCSweeps20000Instances: an installation of 20,000 GCP instances, 5,000 of them
// orphans, swept by GCWorkflow on a real worker: every orphan goes, nothing else does, and
// no payload of the sweep comes near the limit.
func TestGCSweeps20000Instances(t *testing.T) {
	const total, orphans = 20000, 5000
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv := gcptest.NewServer(t)
	const project, zone, installation = "scale", "europe-west1-b", "scale-gc"
	old := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	for i := range total {
		uid := fmt.Sprintf("%08d-0000-4000-8000-000000000000", i)
		inst := &computepb.Instance{
			Name:   proto.String(fmt.Sprintf("px-%016d-1", i)),
			Status: proto.String(computepb.Instance_RUNNING.String()),
			Labels: map[string]string{provider.LabelInstallation: installation, provider.LabelProxyUID: uid,
				provider.LabelManagedBy: provider.ManagedByValue},
		}
		if i%(total/orphans) == 0 { // old enough to be swept; the rest are mid-create
			inst.CreationTimestamp = proto.String(old)
		}
		srv.AddInstance(project, zone, inst)
	}

	res := sweep(ctx, t, installation, registry.Config{Enabled: []v1alpha1.Provider{v1alpha1.ProviderGCP},
		GCP: gcp.Config{DefaultProject: project, ClientOptions: srv.ClientOptions()}})
	assert.False(t, res.Skipped, res.SkipReason)
	assert.Equal(t, orphans, res.DeletedCount)
	assert.Equal(t, total-orphans, res.SparedCount)
	assert.Equal(t, map[string]int{workflows.GCReasonTooYoung: total - orphans}, res.SparedBy)
	assert.Empty(t, res.Errors)
	assert.LessOrEqual(t, len(res.Deleted), 20)
	left := srv.Instances()
	assert.Len(t, left, total-orphans)
	for _, inst := range left {
		assert.NotEqual(t, old, inst.Resource.GetCreationTimestamp(), "%s was an orphan", inst.Name)
	}
}

// sweep runs GCWorkflow once, with a 10-minute minimum age, on a worker of its own
// with the providers pcfg enables, and returns its result; the run completing is the
// proof that no payload of it is over the limit.
func sweep(ctx context.Context, t *testing.T, installation string, pcfg registry.Config) workflows.GCResult {
	t.Helper()
	tenv := testenv.Temporal(t)
	queue := "scale-" + fmt.Sprint(time.Now().UnixNano())
	w, err := worker.New(ctx, worker.Config{TaskQueue: queue, Installation: installation, MonitorShards: 1, Providers: pcfg},
		tenv.Client, testenv.Kube(t).Client, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(w.Stop)
	run, err := tenv.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: queue, ID: "gc-" + queue},
		contract.GCWorkflowType, workflows.GCInput{Installation: installation, Providers: pcfg.Enabled, MinAge: 10 * time.Minute})
	require.NoError(t, err)
	var res workflows.GCResult
	require.NoError(t, run.Get(ctx, &res), "the sweep completes: no payload of it is over the limit")
	return res
}
