package life

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// surgeWatch is what watchSurge saw of a pool while every member was replaced.
type surgeWatch struct {
	// replacing and instances are the most members replacing and instances seen at once;
	// asked counts the looks that saw a member waiting for the pool's grant.
	replacing, instances, asked int
}

// poolMembers lists pool's Proxies.
func poolMembers(t *testing.T, s *stack.Stack, ns, pool string) []v1alpha1.Proxy {
	t.Helper()
	var list v1alpha1.ProxyList
	require.NoError(t, s.Kube.Client.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelPool: pool}))
	return list.Items
}

// watchSurge looks at pool's n members until each serves from another instance than the
// one first[name] names and is Ready, failing the test at the first look that sees more
// than surge members replacing (phase Replacing, or an instance given up and not deleted)
// or more than n+surge instances at the provider.
func watchSurge(t *testing.T, s *stack.Stack, ns, pool string, n, surge int, first map[string]string) surgeWatch {
	t.Helper()
	var seen surgeWatch
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ms := poolMembers(t, s, ns, pool)
		replacing, instances, done := 0, 0, len(ms) == n
		for i := range ms {
			m := &ms[i]
			if m.Status.Phase == v1alpha1.PhaseReplacing || m.Status.RetiringInstances > 0 {
				replacing++
			}
			if meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.ConditionReplacementPending) {
				seen.asked++
			}
			instances += len(s.InstancesOf(m.UID))
			done = done && stack.Ready(m) && m.Status.Phase == v1alpha1.PhaseReady &&
				m.Status.InstanceName != "" && m.Status.InstanceName != first[m.Name]
		}
		seen.replacing, seen.instances = max(seen.replacing, replacing), max(seen.instances, instances)
		require.LessOrEqual(t, replacing, surge, "more members replacing at once than maxSurge allows")
		require.LessOrEqual(t, instances, n+surge, "more instances than replicas + maxSurge")
		if done {
			return seen
		}
		require.True(t, time.Now().Before(deadline), "not every member was replaced")
		time.Sleep(100 * time.Millisecond) // polling the stack, not synchronising
	}
}

// instanceNames maps pool's members to the instance each serves from now.
func instanceNames(t *testing.T, s *stack.Stack, ns, pool string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range poolMembers(t, s, ns, pool) {
		out[m.Name] = m.Status.InstanceName
	}
	return out
}

// startSurgePool creates pool name of n local proxies built from the stack's template
// after mut, rolled with maxSurge surge and maxUnavailable 0, and waits until all n are
// Ready.
func startSurgePool(t *testing.T, s *stack.Stack, ns, name string, n, surge int, mut func(*v1alpha1.ProxySpec)) *v1alpha1.ProxyPool {
	t.Helper()
	spec := stack.Tagged(s.LocalProxy(ns, "template"), ns).Spec
	mut(&spec)
	pool := &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ProxyPoolSpec{
			Replicas: ptr.To(int32(n)),
			Template: v1alpha1.ProxyTemplate{Spec: spec},
			Strategy: v1alpha1.PoolStrategy{MaxSurge: ptr.To(intstr.FromInt(surge)), MaxUnavailable: ptr.To(intstr.FromInt32(0))},
		},
	}
	require.NoError(t, s.Kube.Client.Create(context.Background(), pool))
	require.Eventually(t, func() bool {
		ms := poolMembers(t, s, ns, name)
		for i := range ms {
			if !stack.Ready(&ms[i]) {
				return false
			}
		}
		return len(ms) == n
	}, 3*time.Minute, 100*time.Millisecond, "%d Ready members", n)
	return pool
}
