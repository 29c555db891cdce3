package life

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestPoolRollsASecretRotationWithinTheSurge: the cloud-init Secret a pool of 5 boots
// from is rotated; every member's workflow notices at once and asks to be replaced, and
// the pool grants them one at a time (maxSurge 1): at most 1 replacing and 6 instances at
// every look, until every member runs a new instance. Without the pool's grants every
// member would follow the Secret at the same moment.
func TestPoolRollsASecretRotationWithinTheSurge(t *testing.T) {
	const n, surge = 5, 1
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "boot", Labels: map[string]string{v1alpha1.LabelCloudInit: "true"}},
		Data:       map[string][]byte{"startup-script": []byte("#!/bin/sh\necho one\n")},
	}
	require.NoError(t, s.Kube.Client.Create(ctx, secret))
	spec := stack.Tagged(s.LocalProxy(ns, "template"), ns).Spec
	spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "boot", Key: "startup-script"}}
	pool := &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "booted"},
		Spec: v1alpha1.ProxyPoolSpec{
			Replicas: ptr.To(int32(n)),
			Template: v1alpha1.ProxyTemplate{Spec: spec},
			Strategy: v1alpha1.PoolStrategy{MaxSurge: ptr.To(intstr.FromInt32(surge)), MaxUnavailable: ptr.To(intstr.FromInt32(0))},
		},
	}
	require.NoError(t, s.Kube.Client.Create(ctx, pool))
	members := func() []v1alpha1.Proxy {
		var list v1alpha1.ProxyList
		require.NoError(t, s.Kube.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelPool: pool.Name}))
		return list.Items
	}
	require.Eventually(t, func() bool {
		ms := members()
		for i := range ms {
			if !stack.Ready(&ms[i]) {
				return false
			}
		}
		return len(ms) == n
	}, 3*time.Minute, 100*time.Millisecond, "five Ready members")
	first := map[string]string{}
	for _, m := range members() {
		first[m.Name] = m.Status.InstanceName
	}

	secret.Data["startup-script"] = []byte("#!/bin/sh\necho two\n")
	require.NoError(t, s.Kube.Client.Update(ctx, secret))

	deadline := time.Now().Add(5 * time.Minute)
	most := 0
	for {
		ms := members()
		replacing, instances, done := 0, 0, len(ms) == n
		for i := range ms {
			m := &ms[i]
			if m.Status.Phase == v1alpha1.PhaseReplacing || m.Status.RetiringInstances > 0 {
				replacing++
			}
			instances += len(s.InstancesOf(m.UID))
			done = done && stack.Ready(m) && m.Status.Phase == v1alpha1.PhaseReady && m.Status.InstanceName != first[m.Name]
		}
		most = max(most, replacing)
		require.LessOrEqual(t, replacing, surge, "more members replacing at once than maxSurge allows")
		require.LessOrEqual(t, instances, n+surge, "more instances than replicas + maxSurge")
		if done {
			break
		}
		require.True(t, time.Now().Before(deadline), "the rotation did not reach every member")
		time.Sleep(100 * time.Millisecond) // polling the stack, not synchronising
	}
	t.Logf("rotation of a pool of %d: at most %d replacing at once", n, most)
	e2e.RecordHistory(t, s, contract.ProxyWorkflowID(ns, pool.Name+"-0"), "pool-rotation.json")
}
