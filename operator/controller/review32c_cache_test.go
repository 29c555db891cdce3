package controller

import (
	"context"
	"sync"
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

// review32cLaggingCache is the manager's cache as a reconcile sees it: reads go to the API
// server, except that the Proxies in stale are listed as the informer last delivered them.
type review32cLaggingCache struct {
	ctrlclient.Client
	mu    sync.Mutex
	stale map[string]v1alpha1.Proxy
}

func (c *review32cLaggingCache) setStale(ps ...v1alpha1.Proxy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stale = map[string]v1alpha1.Proxy{}
	for _, p := range ps {
		c.stale[p.Name] = *p.DeepCopy()
	}
}

func (c *review32cLaggingCache) List(ctx context.Context, list ctrlclient.ObjectList, opts ...ctrlclient.ListOption) error {
	if err := c.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if pl, ok := list.(*v1alpha1.ProxyList); ok {
		for i := range pl.Items {
			if s, ok := c.stale[pl.Items[i].Name]; ok {
				pl.Items[i] = *s.DeepCopy()
			}
		}
	}
	return nil
}

// review32cGrants records the pool's signals.
type review32cGrants struct {
	mu  sync.Mutex
	ids []string
}

func (g *review32cGrants) SignalWorkflow(_ context.Context, id, _, _ string, _ any) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ids = append(g.ids, id)
	return nil
}

func review32cSetStatus(t *testing.T, c ctrlclient.Client, p *v1alpha1.Proxy, ready, pending bool) {
	t.Helper()
	now := metav1.Now()
	cond := func(typ string, ok bool, reason string) metav1.Condition {
		st := metav1.ConditionFalse
		if ok {
			st = metav1.ConditionTrue
		}
		return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: "test", LastTransitionTime: now}
	}
	p.Status.ObservedGeneration = p.Generation
	p.Status.Phase = v1alpha1.PhaseReady
	reason := v1alpha1.ReasonNoneWanted
	if pending {
		reason = v1alpha1.ReasonBanned
	}
	if !ready {
		p.Status.Phase, reason = v1alpha1.PhaseUnhealthy, v1alpha1.ReasonUnhealthyGrace
	}
	p.Status.Conditions = []metav1.Condition{
		cond(v1alpha1.ConditionReady, ready, v1alpha1.ReasonReady),
		cond(v1alpha1.ConditionHealthy, ready, v1alpha1.ReasonProbeSucceeded),
		cond(v1alpha1.ConditionReplacementPending, pending, reason),
	}
	require.NoError(t, c.Status().Update(context.Background(), p))
}

// TestReview32cLaggingCacheGrantsTwice: the grant annotation is read back through the
// manager's cache. A reconcile that follows the one that granted (the pool's key was marked
// dirty meanwhile: a member's status changed while it ran) can start before the informer
// has delivered the annotation patch. It then sees the granted member as not granted, does
// not count it, and grants the budget again to whichever member sorts first — here one
// that fell ill in between, whose own patch carries a fresh resourceVersion and so is not
// refused. Two members replace at once with maxSurge 1. (The optimistic lock protects only
// the member patched twice; a ReplicaSet's "expectations" exist for exactly this.)
func TestReview32cLaggingCacheGrantsTwice(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "r32c-"}}
	require.NoError(t, k.Client.Create(ctx, ns))

	pool := &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "eu"},
		Spec: v1alpha1.ProxyPoolSpec{
			Replicas: ptr.To(int32(3)),
			Strategy: v1alpha1.PoolStrategy{MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(0))},
			Template: v1alpha1.ProxyTemplate{Spec: v1alpha1.ProxySpec{
				Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{},
				HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/"},
			}},
		},
	}
	require.NoError(t, k.Client.Create(ctx, pool))
	t.Cleanup(func() { review32cCleanup(ctx, k.Client, ns.Name) })
	cache := &review32cLaggingCache{Client: k.Client}
	grants := &review32cGrants{}
	r := &PoolReconciler{Client: cache, Temporal: grants, Now: time.Now}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns.Name, Name: "eu"}}
	_, err := r.Reconcile(ctx, req) // creates eu-0, eu-1, eu-2
	require.NoError(t, err)
	get := func(name string) *v1alpha1.Proxy {
		var p v1alpha1.Proxy
		require.NoError(t, k.Client.Get(ctx, types.NamespacedName{Namespace: ns.Name, Name: name}, &p))
		return &p
	}
	for i, name := range []string{"eu-0", "eu-1", "eu-2"} {
		review32cSetStatus(t, k.Client, get(name), true, i == 0) // eu-0 is banned and asks
	}
	// What the informer holds when reconcile 1 lists the members.
	atList := []v1alpha1.Proxy{*get("eu-0"), *get("eu-1"), *get("eu-2")}
	// While reconcile 1 runs, eu-1 falls ill for good and asks too (its event marks the
	// pool dirty: reconcile 2 follows at once).
	review32cSetStatus(t, k.Client, get("eu-1"), false, true)

	cache.setStale(atList...)
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	require.Contains(t, get("eu-0").Annotations, AnnotationReplaceGranted, "reconcile 1 grants eu-0")

	// Reconcile 2: the informer has delivered eu-1's status (older) but not yet eu-0's
	// annotation patch (newer).
	cache.setStale(atList[0])
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)

	granted := 0
	for _, name := range []string{"eu-0", "eu-1", "eu-2"} {
		if _, ok := get(name).Annotations[AnnotationReplaceGranted]; ok {
			granted++
		}
	}
	assert.LessOrEqual(t, granted, 1, "members granted at once with maxSurge 1 (signals sent: %v)", grants.ids)
}

// review32cCleanup deletes the namespace's pools and Proxies, finalizers dropped: envtest
// has no namespace controller, and other tests' pool controllers would find them.
func review32cCleanup(ctx context.Context, c ctrlclient.Client, ns string) {
	drop := ctrlclient.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
	var pools v1alpha1.ProxyPoolList
	if c.List(ctx, &pools, ctrlclient.InNamespace(ns)) == nil {
		for i := range pools.Items {
			_ = c.Patch(ctx, &pools.Items[i], drop)
			_ = c.Delete(ctx, &pools.Items[i])
		}
	}
	var proxies v1alpha1.ProxyList
	if c.List(ctx, &proxies, ctrlclient.InNamespace(ns)) == nil {
		for i := range proxies.Items {
			_ = c.Patch(ctx, &proxies.Items[i], drop)
			_ = c.Delete(ctx, &proxies.Items[i])
		}
	}
}
