package recovery

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/discovery/service"
	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/operator/controller"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestTerminatedRunLeavesDiscoveryAtOnce: a workflow terminated by hand publishes nothing as
// it ends; discovery drops its proxy at the next incremental pass (by the run's close
// time), not at the full pass, which this discovery does only hourly.
func TestTerminatedRunLeavesDiscoveryAtOnce(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	require.NoError(t, s.Kube.Client.Create(ctx, stack.Tagged(s.LocalProxy(ns, "gone"), ns)))
	s.WaitFor(t, ns, "gone", time.Minute, "Ready", stack.Ready)
	d := s.StartDiscovery(t, func(c *service.Config) { c.FullResyncInterval = time.Hour })
	c := e2e.NewCrawler(t, d, ns)
	listed := func() int {
		list, err := c.Client.ListProxies(ctx, c.Selector(), nil)
		require.NoError(t, err)
		return list.Count
	}
	require.Eventually(t, func() bool { return listed() == 1 }, 30*time.Second, 100*time.Millisecond)

	require.NoError(t, s.Temporal.Client.TerminateWorkflow(ctx, contract.ProxyWorkflowID(ns, "gone"), "", "terminated by hand in a test"))
	require.Eventually(t, func() bool { return listed() == 0 }, 30*time.Second, 100*time.Millisecond,
		"discovery still lists the proxy of a terminated workflow")
}

// TestTerminatedRunIsRestartedAndAdopts: the controller's resync starts a terminated
// workflow again, with a Warning event; the new run starts without state, finds the
// instance the old run left by its UID label and adopts it: no new instance, the same
// address, Ready again, and back in discovery.
func TestTerminatedRunIsRestartedAndAdopts(t *testing.T) {
	s := stack.Start(t, stack.Options{ResyncInterval: time.Second})
	ctx := context.Background()
	ns := s.Namespace(t)
	require.NoError(t, s.Kube.Client.Create(ctx, stack.Tagged(s.LocalProxy(ns, "kept"), ns)))
	p := s.WaitFor(t, ns, "kept", time.Minute, "Ready", stack.Ready)
	instance, uid := p.Status.InstanceName, p.UID
	id := contract.ProxyWorkflowID(ns, "kept")
	before, err := s.Temporal.Client.DescribeWorkflow(ctx, id, "")
	require.NoError(t, err)
	eventsBefore := len(s.Events())

	require.NoError(t, s.Temporal.Client.TerminateWorkflow(ctx, id, "", "terminated by hand in a test"))

	require.Eventually(t, func() bool {
		var list eventsv1.EventList
		require.NoError(t, s.Kube.Client.List(ctx, &list, ctrlclient.InNamespace(ns)))
		return slices.ContainsFunc(list.Items, func(e eventsv1.Event) bool {
			return e.Reason == controller.EventWorkflowRestarted && e.Type == corev1.EventTypeWarning && e.Regarding.Name == "kept"
		})
	}, time.Minute, 100*time.Millisecond, "no WorkflowRestarted event")
	var after *enums.WorkflowExecutionStatus
	require.Eventually(t, func() bool {
		desc, err := s.Temporal.Client.DescribeWorkflow(ctx, id, "")
		if err != nil || desc.WorkflowExecution.RunID == before.WorkflowExecution.RunID {
			return false
		}
		st := desc.Status
		after = &st
		return true
	}, time.Minute, 100*time.Millisecond, "no new run")
	assert.Equal(t, enums.WORKFLOW_EXECUTION_STATUS_RUNNING, *after)

	// The new run found and kept the instance; nothing was created or deleted.
	require.Eventually(t, func() bool {
		st, err := s.Temporal.Client.QueryWorkflow(ctx, id, "", contract.QueryState)
		if err != nil {
			return false
		}
		var state struct {
			Unlisted bool `json:"unlisted"`
			Instance *struct {
				Name string `json:"name"`
			} `json:"instance"`
		}
		return st.Get(&state) == nil && !state.Unlisted && state.Instance != nil && state.Instance.Name == instance
	}, time.Minute, 100*time.Millisecond, "the new run did not adopt %s", instance)
	p = s.WaitFor(t, ns, "kept", time.Minute, "Ready on the same instance", func(p *v1alpha1.Proxy) bool {
		return stack.Ready(p) && p.Status.InstanceName == instance
	})
	assert.Empty(t, s.Events()[eventsBefore:], "no instance was created or deleted")
	assert.Len(t, s.InstancesOf(uid), 1)
	_, err = s.Fetch(p, "/after-restart")
	require.NoError(t, err)

	d := s.StartDiscovery(t)
	c := e2e.NewCrawler(t, d, ns)
	require.Eventually(t, func() bool {
		healthy := true
		list, err := c.Client.ListProxies(ctx, c.Selector(), &healthy)
		return err == nil && list.Count == 1
	}, 30*time.Second, 100*time.Millisecond, "discovery does not list the proxy again")

	require.NoError(t, s.Kube.Client.Delete(ctx, p))
	s.WaitGone(t, ns, "kept", time.Minute)
	assert.Empty(t, s.InstancesOf(uid))
	e2e.RecordHistory(t, s, id, "adopt-after-terminate.json")
}
