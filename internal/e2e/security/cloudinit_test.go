package security

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

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
	e2e.RecordHistory(t, s, contract.ProxyWorkflowID(ns, "booted"), "cloud-init-rotation.json")
}
