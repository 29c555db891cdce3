package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{Temporal: true, Kube: true}))
}

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
	recordHistory(t, s, contract.ProxyWorkflowID(ns, "web-1"), "lifecycle.json")
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
	recordHistory(t, s, contract.ProxyWorkflowID(ns, "slow"), "delete-while-provisioning.json")
}

// TestCloudInitSecretNeverInHistory puts a canary in a cloud-init Secret, provisions a Proxy
// with it, rotates it (which replaces the instance) and searches every workflow history of
// the namespace for the canary.
func TestCloudInitSecretNeverInHistory(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	canary := fmt.Sprintf("canary-%d-do-not-leak", time.Now().UnixNano())
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "boot", Labels: map[string]string{v1alpha1.LabelCloudInit: "true"}},
		Data:       map[string][]byte{"startup-script": []byte("#!/bin/sh\necho " + canary + "\n")},
	}
	require.NoError(t, s.Kube.Client.Create(ctx, secret))
	p := s.LocalProxy(ns, "booted")
	p.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "boot", Key: "startup-script"}}
	require.NoError(t, s.Kube.Client.Create(ctx, p))
	p = s.WaitFor(t, ns, "booted", time.Minute, "Ready", stack.Ready)
	first := p.Status.InstanceName

	// Rotation replaces the instance although the Proxy's spec did not change.
	secret.Data["startup-script"] = []byte("#!/bin/sh\necho " + canary + "-rotated\n")
	require.NoError(t, s.Kube.Client.Update(ctx, secret))
	s.WaitFor(t, ns, "booted", time.Minute, "replaced after Secret rotation", func(p *v1alpha1.Proxy) bool {
		return stack.Ready(p) && p.Status.InstanceName != first
	})

	needles := [][]byte{[]byte(canary), []byte(base64.StdEncoding.EncodeToString([]byte(canary)))}
	histories := 0
	resp, err := s.Temporal.Client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
		Query: fmt.Sprintf("WorkflowId STARTS_WITH %q", contract.ProxyWorkflowIDPrefix+ns+"/"),
	})
	require.NoError(t, err)
	for _, ex := range resp.Executions {
		it := s.Temporal.Client.GetWorkflowHistory(ctx, ex.Execution.WorkflowId, ex.Execution.RunId, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		for it.HasNext() {
			ev, err := it.Next()
			require.NoError(t, err)
			raw, err := proto.Marshal(ev)
			require.NoError(t, err)
			for _, n := range needles {
				require.False(t, bytes.Contains(raw, n), "secret data found in history of %s, event %d (%s)", ex.Execution.WorkflowId, ev.EventId, ev.EventType)
			}
		}
		histories++
	}
	require.Positive(t, histories, "no history was searched")

	require.NoError(t, s.Kube.Client.Delete(ctx, p))
	s.WaitGone(t, ns, "booted", time.Minute)
	recordHistory(t, s, contract.ProxyWorkflowID(ns, "booted"), "cloud-init-rotation.json")
}
