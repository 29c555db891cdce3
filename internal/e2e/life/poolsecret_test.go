package life

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	pool := startSurgePool(t, s, ns, "booted", n, surge, func(spec *v1alpha1.ProxySpec) {
		spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "boot", Key: "startup-script"}}
	})
	first := instanceNames(t, s, ns, pool.Name)

	secret.Data["startup-script"] = []byte("#!/bin/sh\necho two\n")
	require.NoError(t, s.Kube.Client.Update(ctx, secret))

	seen := watchSurge(t, s, ns, pool.Name, n, surge, first)
	t.Logf("rotation of a pool of %d: at most %d replacing and %d instances at once; %d looks saw a member waiting for the pool",
		n, seen.replacing, seen.instances, seen.asked)
	assert.Positive(t, seen.asked, "no member ever waited for the pool")
	e2e.RecordHistory(t, s, contract.ProxyWorkflowID(ns, pool.Name+"-0"), "pool-rotation.json")
}
