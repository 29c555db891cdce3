package life

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestPoolRollsUnderCrawlerLoad rolls a template change through a pool of 10 (maxSurge 2,
// maxUnavailable 0) while eight crawlers lease, use and release its proxies through
// discovery without pause: discovery offers at least 10 healthy proxies of the pool at
// every look, no more than 2 Proxies are being replaced at once, and every acquire (each
// with a short wait) is granted.
func TestPoolRollsUnderCrawlerLoad(t *testing.T) {
	const n = 10
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	d := s.StartDiscovery(t)
	pool := &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "load"},
		Spec: v1alpha1.ProxyPoolSpec{
			Replicas: ptr.To(int32(n)),
			Template: v1alpha1.ProxyTemplate{Spec: stack.Tagged(s.LocalProxy(ns, "template"), ns).Spec},
			Strategy: v1alpha1.PoolStrategy{MaxSurge: ptr.To(intstr.FromInt32(2)), MaxUnavailable: ptr.To(intstr.FromInt32(0))},
		},
	}
	require.NoError(t, s.Kube.Client.Create(ctx, pool))
	sel := discovery.Selector{"run": ns}
	healthy := func() int {
		yes := true
		return len(d.Store.List(sel, &yes))
	}
	require.Eventually(t, func() bool { return healthy() == n }, 3*time.Minute, 100*time.Millisecond, "ten healthy proxies in discovery")

	// Crawlers: lease (waiting up to 10 s), fetch through the proxy, release, again.
	c := dclient.New(d.URL, d.Token)
	loadCtx, stopLoad := context.WithCancel(ctx)
	var granted, failed atomic.Int64
	var crawlers sync.WaitGroup
	for range 8 {
		crawlers.Go(func() {
			for loadCtx.Err() == nil {
				l, err := c.Acquire(loadCtx, dclient.AcquireRequest{Selector: map[string]string{"run": ns}, Wait: 10 * time.Second, TTL: time.Minute})
				if loadCtx.Err() != nil {
					return
				}
				if err != nil {
					failed.Add(1)
					t.Logf("acquire refused during the rollout: %v", err)
					continue
				}
				granted.Add(1)
				_ = c.Release(context.Background(), l.ID)
			}
		})
	}
	defer func() { stopLoad(); crawlers.Wait() }()

	first := map[string]string{}
	var list v1alpha1.ProxyList
	require.NoError(t, s.Kube.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelPool: "load"}))
	for _, m := range list.Items {
		first[m.Name] = m.Status.InstanceName
	}
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := s.Kube.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
			return err
		}
		pool.Spec.Template.Spec.Port = 3129
		return s.Kube.Client.Update(ctx, pool)
	}))
	deadline := time.Now().Add(5 * time.Minute)
	fewest, most := n, 0
	for {
		h := healthy()
		fewest = min(fewest, h)
		require.GreaterOrEqual(t, h, n, "discovery offered fewer than ten healthy proxies of the pool during the rollout")
		require.NoError(t, s.Kube.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelPool: "load"}))
		replacing, done := 0, len(list.Items) == n
		for i := range list.Items {
			m := &list.Items[i]
			if m.Spec.Port == 3129 && (m.Status.Phase != v1alpha1.PhaseReady || m.Status.ObservedGeneration != m.Generation) {
				replacing++
			}
			done = done && stack.Ready(m) && m.Spec.Port == 3129 && m.Status.ObservedGeneration == m.Generation &&
				m.Status.InstanceName != first[m.Name]
		}
		most = max(most, replacing)
		require.LessOrEqual(t, replacing, 2, "more Proxies replaced at once than maxSurge allows")
		if done {
			break
		}
		require.True(t, time.Now().Before(deadline), "the rollout did not finish")
		time.Sleep(100 * time.Millisecond) // polling the stack, not synchronising
	}
	stopLoad()
	crawlers.Wait()
	t.Logf("rollout of 10 under load: %d leases granted, %d refused, at least %d healthy, at most %d replaced at once", granted.Load(), failed.Load(), fewest, most)
	assert.Zero(t, failed.Load(), "an acquire was refused during the rollout")
	assert.Positive(t, granted.Load())
}
