package life

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestProxyLifecycle follows one Proxy from apply to delete: provisioned with an address
// that carries traffic, replaced make-before-break on an edit and on a CLI signal, and
// deleted with its instance.
func TestProxyLifecycle(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	p := s.LocalProxy(ns, "web-1")
	require.NoError(t, s.Kube.Client.Create(ctx, p))

	// Apply → Provisioned with an IP, then Ready; a request through it reaches the target.
	p = s.WaitFor(t, ns, "web-1", time.Minute, "Ready", stack.Ready)
	prov := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionProvisioned)
	require.NotNil(t, prov)
	assert.Equal(t, metav1.ConditionTrue, prov.Status)
	assert.Equal(t, "127.0.0.1", p.Status.IP)
	assert.Equal(t, contract.ProxyWorkflowID(ns, "web-1"), p.Status.WorkflowID)
	assert.Contains(t, p.Finalizers, v1alpha1.Finalizer)
	body, err := s.Fetch(p, "/through-the-proxy")
	require.NoError(t, err)
	assert.Equal(t, "hello from the target: /through-the-proxy", body)
	first := p.Status.InstanceName
	require.Len(t, s.InstancesOf(p.UID), 1)

	// Edit a field that shapes the instance → a new instance replaces the old one, and at
	// no moment does the Proxy have none.
	p.Spec.Port = 3129
	require.NoError(t, s.Kube.Client.Update(ctx, p))
	p = s.WaitFor(t, ns, "web-1", time.Minute, "replaced after edit", func(p *v1alpha1.Proxy) bool {
		return stack.Ready(p) && p.Status.InstanceName != first && len(s.InstancesOf(p.UID)) == 1
	})
	assert.Equal(t, int32(1), p.Status.Replacements)
	assertMakeBeforeBreak(t, s.Events(), first, p.Status.InstanceName)
	_, err = s.Fetch(p, "/after-edit")
	require.NoError(t, err)

	// An operator asks for a replacement with the temporal CLI, as docs/operations.md says.
	second := p.Status.InstanceName
	out, err := exec.Command(s.Temporal.Binary, "workflow", "signal",
		"--address", s.Temporal.HostPort, "--namespace", s.Temporal.Namespace,
		"--workflow-id", contract.ProxyWorkflowID(ns, "web-1"),
		"--name", contract.SignalReplace, "--input", `{"reason":"manual"}`).CombinedOutput()
	require.NoError(t, err, string(out))
	p = s.WaitFor(t, ns, "web-1", time.Minute, "replaced after the CLI signal", func(p *v1alpha1.Proxy) bool {
		return stack.Ready(p) && p.Status.InstanceName != second && len(s.InstancesOf(p.UID)) == 1
	})
	assert.Equal(t, int32(2), p.Status.Replacements)
	assertMakeBeforeBreak(t, s.Events(), second, p.Status.InstanceName)

	// Delete → instance gone, then the object.
	uid := p.UID
	require.NoError(t, s.Kube.Client.Delete(ctx, p))
	s.WaitGone(t, ns, "web-1", time.Minute)
	assert.Empty(t, s.InstancesOf(uid), "instance left behind")

	// The workflow ends by itself, right after it released the finalizer.
	require.Eventually(t, func() bool {
		desc, err := s.Temporal.Client.DescribeWorkflow(ctx, contract.ProxyWorkflowID(ns, "web-1"), "")
		return err == nil && desc.Status == enums.WORKFLOW_EXECUTION_STATUS_COMPLETED
	}, 30*time.Second, 50*time.Millisecond, "the workflow did not complete after deleting")
	e2e.RecordHistory(t, s, contract.ProxyWorkflowID(ns, "web-1"), "lifecycle.json")
}

// assertMakeBeforeBreak checks the daemon's log: the new instance was created before the
// old one was deleted, and the count of instances never fell to zero in between.
func assertMakeBeforeBreak(t *testing.T, events []stack.DaemonEvent, oldName, newName string) {
	t.Helper()
	created, deleted := -1, -1
	for i, e := range events {
		if e.Op == "create" && e.Name == newName {
			created = i
		}
		if e.Op == "delete" && e.Name == oldName {
			deleted = i
		}
	}
	require.GreaterOrEqual(t, created, 0, "new instance %s never created: %+v", newName, events)
	require.GreaterOrEqual(t, deleted, 0, "old instance %s never deleted: %+v", oldName, events)
	assert.Less(t, created, deleted, "new instance must exist before the old one goes: %+v", events)
	assert.Positive(t, events[deleted].Live, "no instance left when the old one was deleted: %+v", events)
}

// TestDeleteWhileProvisioning deletes a Proxy whose instance is still coming up: the
// instance is deleted and the object released.
func TestDeleteWhileProvisioning(t *testing.T) {
	s := stack.Start(t, stack.Options{ProvisionDelay: time.Hour})
	ctx := context.Background()
	ns := s.Namespace(t)
	p := s.LocalProxy(ns, "slow")
	require.NoError(t, s.Kube.Client.Create(ctx, p))
	p = s.WaitFor(t, ns, "slow", time.Minute, "Provisioning with an instance", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseProvisioning && len(s.InstancesOf(p.UID)) == 1
	})
	require.NoError(t, s.Kube.Client.Delete(ctx, p))
	s.WaitGone(t, ns, "slow", time.Minute)
	assert.Empty(t, s.InstancesOf(p.UID))
	e2e.RecordHistory(t, s, contract.ProxyWorkflowID(ns, "slow"), "delete-while-provisioning.json")
}
