package controller

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// review32dDeleteFirstPool creates, in a namespace of its own, cloud-init Secret "boot"
// and a pool of 2 booting from it with maxSurge 0, maxUnavailable 1, reconciles it once
// (creating eu-0 and eu-1) and makes both members Ready on the version they were given,
// as their version 6 runs would say. It returns the reconciler, the request, the Secret and
// the client.
func review32dDeleteFirstPool(t *testing.T) (*PoolReconciler, reconcile.Request, *corev1.Secret, ctrlclient.Client) {
	t.Helper()
	k := testenv.Kube(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "r32d-"}}
	require.NoError(t, k.Client.Create(ctx, ns))
	t.Cleanup(func() { review32cCleanup(ctx, k.Client, ns.Name) })
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "boot", Labels: map[string]string{v1alpha1.LabelCloudInit: "true"}},
		Data:       map[string][]byte{"startup-script": []byte("#!/bin/sh\necho one\n")},
	}
	require.NoError(t, k.Client.Create(ctx, secret))
	pool := &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "eu"},
		Spec: v1alpha1.ProxyPoolSpec{
			Replicas: ptr.To(int32(2)),
			Strategy: v1alpha1.PoolStrategy{MaxSurge: ptr.To(intstr.FromInt32(0)), MaxUnavailable: ptr.To(intstr.FromInt32(1))},
			Template: v1alpha1.ProxyTemplate{Spec: v1alpha1.ProxySpec{
				Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{},
				HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/"},
				CloudInit:   &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "boot", Key: "startup-script"}},
			}},
		},
	}
	require.NoError(t, k.Client.Create(ctx, pool))
	r := &PoolReconciler{Client: k.Client, Now: time.Now}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns.Name, Name: "eu"}}
	_, err := r.Reconcile(ctx, req)
	require.NoError(t, err)
	for _, name := range []string{"eu-0", "eu-1"} {
		var p v1alpha1.Proxy
		require.NoError(t, k.Client.Get(ctx, types.NamespacedName{Namespace: ns.Name, Name: name}, &p))
		now := metav1.Now()
		p.Status.ObservedGeneration = p.Generation
		p.Status.Phase = v1alpha1.PhaseReady
		p.Status.Conditions = []metav1.Condition{
			{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReady, Message: "test", LastTransitionTime: now},
			{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded, Message: "test", LastTransitionTime: now},
			{Type: v1alpha1.ConditionProvisioned, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonInstanceRunning, Message: "test", LastTransitionTime: now},
		}
		require.NoError(t, k.Client.Status().Update(ctx, &p))
	}
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	review32dRequireServing(t, k.Client, ns.Name, "before anything happens to the Secret")
	return r, req, secret, k.Client
}

// review32dServing names those of eu-0 and eu-1 that are gone, being deleted, or not Ready.
func review32dServing(t *testing.T, c ctrlclient.Client, ns string) []string {
	t.Helper()
	var gone []string
	for _, name := range []string{"eu-0", "eu-1"} {
		var p v1alpha1.Proxy
		err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &p)
		if err != nil || p.DeletionTimestamp != nil || p.Status.Phase != v1alpha1.PhaseReady {
			gone = append(gone, name)
		}
	}
	return gone
}

// review32dRequireServing requires eu-0 and eu-1 to be there and Ready.
func review32dRequireServing(t *testing.T, c ctrlclient.Client, ns, when string) {
	t.Helper()
	require.Empty(t, review32dServing(t, c, ns), "members deleted %s", when)
}

// TestReview32dDeletedSecretDeletesServingMembers: deleting a pool's cloud-init Secret (or
// removing its label, which drops it from the operator's cache) costs no serving member.
// A first design named the Secret's version in the template hash: a Secret it could not
// read became a new version, and a delete-first pool (maxSurge 0) deleted Ready members
// for it, whose replacements could never provision.
func TestReview32dDeletedSecretDeletesServingMembers(t *testing.T) {
	r, req, secret, c := review32dDeleteFirstPool(t)
	ctx := context.Background()
	require.NoError(t, c.Delete(ctx, secret))
	_, err := r.Reconcile(ctx, req)
	require.NoError(t, err)
	assert.Empty(t, review32dServing(t, c, req.Namespace),
		"a Secret that cannot be read is no version to roll out: no serving member is deleted for it")
}

// TestReview32dSecretMetadataEditRebuildsADeleteFirstPool: a write to the Secret that
// changes no data (a label or an annotation: kubectl annotate, a secret-sync tool's
// bookkeeping) rebuilds nothing, not even in a delete-first pool. The first design hashed
// the Secret's resourceVersion into the template, which every write changes.
func TestReview32dSecretMetadataEditRebuildsADeleteFirstPool(t *testing.T) {
	r, req, secret, c := review32dDeleteFirstPool(t)
	ctx := context.Background()
	before := secret.DeepCopy()
	secret.Annotations = map[string]string{"example.com/owner": "team-crawl"}
	require.NoError(t, c.Patch(ctx, secret, ctrlclient.MergeFrom(before)))
	require.NotEqual(t, before.ResourceVersion, secret.ResourceVersion)
	_, err := r.Reconcile(ctx, req)
	require.NoError(t, err)
	assert.Empty(t, review32dServing(t, c, req.Namespace),
		"the cloud-init data did not change: no member is deleted and rebuilt")
}
