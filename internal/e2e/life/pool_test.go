package life

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestPoolLifecycle runs a ProxyPool on the whole stack (operator, worker, local provider):
// its Proxies come up with instances, a template change replaces them one at a time
// (maxSurge 1) with none of them unready, `kubectl scale` (the scale subresource) grows and shrinks it, and
// deleting it deletes every Proxy and instance before the pool itself goes.
func TestPoolLifecycle(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	pool := &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: v1alpha1.ProxyPoolSpec{
			Replicas: ptr.To(int32(2)),
			Template: v1alpha1.ProxyTemplate{Spec: s.LocalProxy(ns, "template").Spec},
			Strategy: v1alpha1.PoolStrategy{MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(0))},
		},
	}
	require.NoError(t, s.Kube.Client.Create(ctx, pool))

	members := func() []v1alpha1.Proxy {
		var list v1alpha1.ProxyList
		require.NoError(t, s.Kube.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelPool: "web"}))
		return list.Items
	}
	readyCount := func(ms []v1alpha1.Proxy) int {
		n := 0
		for i := range ms {
			if ms[i].Status.Phase == v1alpha1.PhaseReady || ms[i].Status.Phase == v1alpha1.PhaseReplacing {
				n++
			}
		}
		return n
	}
	waitPool := func(what string, ok func(v1alpha1.ProxyPool, []v1alpha1.Proxy) bool) {
		t.Helper()
		require.Eventually(t, func() bool {
			var p v1alpha1.ProxyPool
			if err := s.Kube.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p); err != nil {
				return false
			}
			return ok(p, members())
		}, 2*time.Minute, 100*time.Millisecond, what)
	}
	allReady := func(n int) func(v1alpha1.ProxyPool, []v1alpha1.Proxy) bool {
		return func(p v1alpha1.ProxyPool, ms []v1alpha1.Proxy) bool {
			if len(ms) != n || p.Status.ReadyReplicas != int32(n) {
				return false
			}
			for i := range ms {
				if !stack.Ready(&ms[i]) || len(s.InstancesOf(ms[i].UID)) != 1 {
					return false
				}
			}
			return true
		}
	}
	waitPool("two Ready Proxies with one instance each", allReady(2))
	first := map[string]string{}
	for _, m := range members() {
		first[m.Name] = m.Status.InstanceName
		_, err := s.Fetch(&m, "/through-a-pool-member")
		require.NoError(t, err)
	}

	// A template change: each Proxy is replaced make-before-break, one at a time, and the
	// pool never has fewer than two serving.
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := s.Kube.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
			return err
		}
		pool.Spec.Template.Spec.Port = 3129
		return s.Kube.Client.Update(ctx, pool)
	}))
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ms := members()
		require.Equal(t, 2, readyCount(ms), "a Proxy stopped serving during the rollout")
		rolling := 0
		for i := range ms {
			if ms[i].Spec.Port == 3129 && (ms[i].Status.Phase != v1alpha1.PhaseReady || ms[i].Status.ObservedGeneration != ms[i].Generation) {
				rolling++
			}
		}
		require.LessOrEqual(t, rolling, 1, "more Proxies replaced at once than maxSurge allows")
		done := len(ms) == 2
		for i := range ms {
			done = done && stack.Ready(&ms[i]) && ms[i].Spec.Port == 3129 && ms[i].Status.InstanceName != first[ms[i].Name]
		}
		if done {
			break
		}
		require.True(t, time.Now().Before(deadline), "the rollout did not finish")
		time.Sleep(100 * time.Millisecond) // polling the stack, not synchronising
	}
	for _, m := range members() {
		assert.EqualValues(t, 1, m.Status.Replacements)
	}

	// kubectl scale, through the scale subresource.
	setScale := func(n int32) {
		require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			sc := &autoscalingv1.Scale{}
			if err := s.Kube.Client.SubResource("scale").Get(ctx, pool, sc); err != nil {
				return err
			}
			sc.Spec.Replicas = n
			return s.Kube.Client.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(sc))
		}))
	}
	setScale(3)
	waitPool("three Ready Proxies", allReady(3))
	setScale(1)
	waitPool("one Ready Proxy", allReady(1))

	// Deleting the pool deletes its Proxies and their instances first.
	var uids []types.UID
	for _, m := range members() {
		uids = append(uids, m.UID)
	}
	require.NoError(t, s.Kube.Client.Delete(ctx, pool))
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(s.Kube.Client.Get(ctx, client.ObjectKeyFromObject(pool), &v1alpha1.ProxyPool{}))
	}, 2*time.Minute, 100*time.Millisecond, "the pool was not deleted")
	assert.Empty(t, members(), "Proxies left behind")
	for _, uid := range uids {
		assert.Empty(t, s.InstancesOf(uid), "an instance left behind")
	}
}
