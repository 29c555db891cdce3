package testenv_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{Temporal: true, Kube: true}))
}

// upsertWorkflow stands in for ProxyWorkflow: it writes every project search attribute,
// then waits for a signal so the test can query it while it is running.
func upsertWorkflow(ctx workflow.Context, phase string) error {
	err := workflow.UpsertTypedSearchAttributes(ctx,
		contract.SearchAttrPhase.ValueSet(phase),
		contract.SearchAttrProvider.ValueSet("local"),
		contract.SearchAttrHealthy.ValueSet(true),
		contract.SearchAttrUpdatedAt.ValueSet(workflow.Now(ctx).UTC()),
	)
	if err != nil {
		return err
	}
	workflow.GetSignalChannel(ctx, "done").Receive(ctx, nil)
	return nil
}

// TestTemporalSearchAttributes proves the dev server runs workflows on a real worker and
// indexes the project's search attributes, which discovery and the Web UI filter by.
func TestTemporalSearchAttributes(t *testing.T) {
	env := testenv.Temporal(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	queue := "testenv-" + t.Name()
	w := worker.New(env.Client, queue, worker.Options{})
	w.RegisterWorkflow(upsertWorkflow)
	require.NoError(t, w.Start())
	defer w.Stop()

	id := contract.ProxyWorkflowID("testenv", "sa")
	run, err := env.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue}, upsertWorkflow, "Ready")
	require.NoError(t, err)

	query := fmt.Sprintf("WorkflowId = %q AND ProxyPhase = 'Ready' AND ProxyProvider = 'local' AND ProxyHealthy = true AND ProxyUpdatedAt > '2000-01-01T00:00:00Z' AND ExecutionStatus = 'Running'", id)
	var found *workflowservice.ListWorkflowExecutionsResponse
	require.Eventually(t, func() bool {
		found, err = env.Client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: query})
		return err == nil && len(found.Executions) == 1
	}, 30*time.Second, 100*time.Millisecond, "workflow never became visible through its search attributes (last error: %v)", err)

	fields := found.Executions[0].SearchAttributes.GetIndexedFields()
	var phase string
	require.NoError(t, converter.GetDefaultDataConverter().FromPayload(fields["ProxyPhase"], &phase))
	assert.Equal(t, "Ready", phase)

	require.NoError(t, env.Client.SignalWorkflow(ctx, id, run.GetRunID(), "done", nil))
	require.NoError(t, run.Get(ctx, nil))

	// The server counted what it bills for: the upsert and the signal (benchmarks of the
	// fleet's cost read these counters).
	require.Eventually(t, func() bool {
		a, err := env.Actions(ctx, env.Namespace)
		return err == nil && a["command_UpsertWorkflowSearchAttributes"] >= 1 && a["grpc_SignalWorkflowExecution"] >= 1 && a["workflow_tasks_completed"] >= 2
	}, 30*time.Second, 200*time.Millisecond, "the server's action counters never showed the upsert and the signal")
}

// TestKubeHasProxyCRD proves the harness installed the CRD and a client can use it.
func TestKubeHasProxyCRD(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "testenv-"}}
	require.NoError(t, k.Client.Create(ctx, ns))
	var list v1alpha1.ProxyList
	require.NoError(t, k.Client.List(ctx, &list))

	out, err := k.RunKubectl(t, nil, "get", "proxies", "-A")
	require.NoError(t, err, out)
}
