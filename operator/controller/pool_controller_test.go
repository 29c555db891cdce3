package controller_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/operator/controller"
)

// These tests run the pool controller alone on the real API server. No Proxy controller
// or workflow runs: the tests play the Proxies' workflows, writing the statuses a rollout
// waits on, so each step of a rollout is theirs to hold or release.

// startPoolController runs the pool controller in a manager of its own, and returns that
// manager (whose event recorder sends events while it runs).
func startPoolController(t *testing.T) manager.Manager {
	return startPoolControllerWith(t, nil)
}

// startPoolControllerWith is startPoolController asking d of the proxies' leases.
func startPoolControllerWith(t *testing.T, d controller.Discovery) manager.Manager {
	t.Helper()
	mgr := testManager(t)
	ctx, cancel := context.WithCancel(context.Background())
	r := &controller.PoolReconciler{Client: mgr.GetClient(), Events: mgr.GetEventRecorder("proxyfleet-operator"), Recheck: 200 * time.Millisecond,
		Discovery: d}
	require.NoError(t, r.SetupWithManager(mgr))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return mgr
}

func pool(ns, name string, replicas int32) *v1alpha1.ProxyPool {
	return &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ProxyPoolSpec{
			Replicas: ptr.To(replicas),
			Template: v1alpha1.ProxyTemplate{
				Metadata: v1alpha1.TemplateMetadata{Labels: map[string]string{"team": "crawl"}},
				Spec: v1alpha1.ProxySpec{
					Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{},
					Attributes:  map[string]v1alpha1.AttributeValue{"region": "eu"},
					HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/"},
				},
			},
		},
	}
}

// members lists the pool's Proxies by name.
func members(t *testing.T, ns, name string) []v1alpha1.Proxy {
	t.Helper()
	var list v1alpha1.ProxyList
	require.NoError(t, testenv.Kube(t).Client.List(context.Background(), &list, ctrlclient.InNamespace(ns),
		ctrlclient.MatchingLabels{v1alpha1.LabelPool: name}))
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items
}

func names(ps []v1alpha1.Proxy) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// serve plays p's workflow: its latest spec applied, Ready (or Replacing while ready).
func serve(t *testing.T, p *v1alpha1.Proxy, phase v1alpha1.Phase) {
	t.Helper()
	before := p.DeepCopy()
	p.Status.ObservedGeneration = p.Generation
	p.Status.Phase = phase
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready"})
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: "ProbeSucceeded"})
	require.NoError(t, testenv.Kube(t).Client.Status().Patch(context.Background(), p, ctrlclient.MergeFrom(before)))
}

// editPool changes the pool as a user would, again if the controller wrote it meanwhile.
func editPool(t *testing.T, pl *v1alpha1.ProxyPool, edit func(*v1alpha1.ProxyPool)) {
	t.Helper()
	k := testenv.Kube(t)
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k.Client.Get(context.Background(), ctrlclient.ObjectKeyFromObject(pl), pl); err != nil {
			return err
		}
		edit(pl)
		return k.Client.Update(context.Background(), pl)
	}))
}

func scale(t *testing.T, ns, name string, replicas int32) {
	t.Helper()
	k := testenv.Kube(t)
	p := &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	// As kubectl scale does, again if the controller wrote the pool meanwhile.
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s := &autoscalingv1.Scale{}
		if err := k.Client.SubResource("scale").Get(context.Background(), p, s); err != nil {
			return err
		}
		s.Spec.Replicas = replicas
		return k.Client.SubResource("scale").Update(context.Background(), p, ctrlclient.WithSubResourceBody(s))
	}))
}

// TestPoolKeepsItsCount: a pool creates its Proxies from its template, owned by it and
// named after it; `kubectl scale` (the scale subresource) grows and shrinks it, the least
// useful first; the scale subresource reports the count and the selector.
func TestPoolKeepsItsCount(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	startPoolController(t)
	ns := namespace(t)
	pl := pool(ns, "eu", 3)
	require.NoError(t, k.Client.Create(ctx, pl))

	require.Eventually(t, func() bool { return len(members(t, ns, "eu")) == 3 }, 20*time.Second, 50*time.Millisecond)
	ms := members(t, ns, "eu")
	assert.Equal(t, []string{"eu-0", "eu-1", "eu-2"}, names(ms))
	for _, p := range ms {
		assert.True(t, metav1.IsControlledBy(&p, pl), "%s is the pool's", p.Name)
		assert.Equal(t, "crawl", p.Labels["team"])
		assert.Equal(t, v1alpha1.AttributeValue("eu"), p.Spec.Attributes["region"])
		assert.EqualValues(t, v1alpha1.DefaultMaxLeases, p.Spec.MaxLeases, "the template's defaults, from the API server")
	}
	require.Eventually(t, func() bool {
		s := &autoscalingv1.Scale{}
		if err := k.Client.SubResource("scale").Get(ctx, pl, s); err != nil {
			return false
		}
		return s.Status.Replicas == 3 && s.Status.Selector == v1alpha1.LabelPool+"=eu"
	}, 20*time.Second, 50*time.Millisecond, "the scale subresource reports the count and the selector")

	scale(t, ns, "eu", 5)
	require.Eventually(t, func() bool { return len(members(t, ns, "eu")) == 5 }, 20*time.Second, 50*time.Millisecond)

	// eu-1 and eu-3 serve; the others do not: scaling to 2 keeps the two that serve.
	for _, p := range members(t, ns, "eu") {
		if p.Name == "eu-1" || p.Name == "eu-3" {
			serve(t, &p, v1alpha1.PhaseReady)
		}
	}
	require.Eventually(t, func() bool {
		var got v1alpha1.ProxyPool
		return k.Client.Get(ctx, ctrlclient.ObjectKeyFromObject(pl), &got) == nil && got.Status.ReadyReplicas == 2
	}, 20*time.Second, 50*time.Millisecond)
	scale(t, ns, "eu", 2)
	require.Eventually(t, func() bool { return len(members(t, ns, "eu")) == 2 }, 20*time.Second, 50*time.Millisecond)
	assert.Equal(t, []string{"eu-1", "eu-3"}, names(members(t, ns, "eu")), "the least useful went first")

	scale(t, ns, "eu", 0)
	require.Eventually(t, func() bool { return len(members(t, ns, "eu")) == 0 }, 20*time.Second, 50*time.Millisecond)
}

// TestPoolShrinksWhereCrawlersAreFewest: asked for its proxies' use, a shrinking pool
// gives up first the proxy resting for a site, then the one holding no lease, and keeps
// the one crawlers hold most; a discovery that cannot answer holds nothing up.
func TestPoolShrinksWhereCrawlersAreFewest(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	d := &demandStub{}
	startPoolControllerWith(t, d)
	ns := namespace(t)
	pl := pool(ns, "eu", 4)
	require.NoError(t, k.Client.Create(ctx, pl))
	require.Eventually(t, func() bool { return len(members(t, ns, "eu")) == 4 }, 20*time.Second, 50*time.Millisecond)
	for _, p := range members(t, ns, "eu") {
		serve(t, &p, v1alpha1.PhaseReady)
	}
	listed := func(name string, leases int, rests ...string) dclient.ListedProxy {
		p := dclient.ListedProxy{Proxy: dclient.Proxy{Name: name, Namespace: ns}, Healthy: true, ActiveLeases: leases, MaxLeases: 4}
		for _, site := range rests {
			if p.Cooldowns == nil {
				p.Cooldowns = map[string]time.Time{}
			}
			p.Cooldowns[site] = time.Now().Add(time.Hour)
		}
		return p
	}
	d.mu.Lock()
	d.proxies = []dclient.ListedProxy{
		listed("eu-0", 1), listed("eu-1", 0), listed("eu-2", 4, "shop.example"), listed("eu-3", 3),
		// Another namespace's proxy of the same name is not the pool's.
		{Proxy: dclient.Proxy{Name: "eu-3", Namespace: "elsewhere"}, ActiveLeases: 0},
	}
	d.mu.Unlock()
	scale(t, ns, "eu", 2)
	require.Eventually(t, func() bool { return len(activeMembers(t, ns, "eu")) == 2 }, 20*time.Second, 50*time.Millisecond)
	assert.Equal(t, []string{"eu-0", "eu-3"}, names(activeMembers(t, ns, "eu")), "the banned one and the idle one went")

	d.set(0, errors.New("connection refused"))
	scale(t, ns, "eu", 1)
	require.Eventually(t, func() bool { return len(activeMembers(t, ns, "eu")) == 1 }, 20*time.Second, 50*time.Millisecond,
		"without discovery the pool still shrinks, by age")
	assert.Equal(t, []string{"eu-3"}, names(activeMembers(t, ns, "eu")))
}

// TestPoolStaggersMaxAge: a template with lifecycle.maxAge gives each Proxy of the pool a
// maxAge of its own, so instances created together do not come due together; a template
// change keeps each one's.
func TestPoolStaggersMaxAge(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	startPoolController(t)
	ns := namespace(t)
	pl := pool(ns, "eu", 3)
	pl.Spec.Template.Spec.Lifecycle = &v1alpha1.Lifecycle{MaxAge: ptr.To(v1alpha1.Duration("24h"))}
	require.NoError(t, k.Client.Create(ctx, pl))
	require.Eventually(t, func() bool { return len(members(t, ns, "eu")) == 3 }, 20*time.Second, 50*time.Millisecond)
	ages := map[string]string{}
	for _, p := range members(t, ns, "eu") {
		age, err := p.Spec.Lifecycle.MaxAge.ParseDuration(0)
		require.NoError(t, err)
		assert.LessOrEqual(t, age, 24*time.Hour)
		assert.Greater(t, age, 19*time.Hour)
		ages[p.Name] = string(*p.Spec.Lifecycle.MaxAge)
	}
	assert.Len(t, slices.Compact(slices.Sorted(maps.Values(ages))), 3, "three Proxies, three ages: %v", ages)

	editPool(t, pl, func(p *v1alpha1.ProxyPool) { p.Spec.Template.Spec.MaxLeases = 7 })
	var updated *v1alpha1.Proxy
	require.Eventually(t, func() bool {
		for _, p := range members(t, ns, "eu") {
			if p.Spec.MaxLeases == 7 {
				updated = &p
				return true
			}
		}
		return false
	}, 20*time.Second, 50*time.Millisecond, "the rollout gives a Proxy the new template")
	assert.Equal(t, ages[updated.Name], string(*updated.Spec.Lifecycle.MaxAge), "with its own maxAge kept")
}

// TestPoolRollsWithinItsSurge: a template change reaches the pool's Proxies at most
// maxSurge at a time, the next only once an updated one is Ready again (its own workflow
// replaces it make-before-break), and with maxUnavailable 0 the Ready count never drops.
func TestPoolRollsWithinItsSurge(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	startPoolController(t)
	ns := namespace(t)
	pl := pool(ns, "roll", 4)
	pl.Spec.Strategy = v1alpha1.PoolStrategy{MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(0))}
	require.NoError(t, k.Client.Create(ctx, pl))
	require.Eventually(t, func() bool { return len(members(t, ns, "roll")) == 4 }, 20*time.Second, 50*time.Millisecond)
	for _, p := range members(t, ns, "roll") {
		serve(t, &p, v1alpha1.PhaseReady)
	}
	oldHash := members(t, ns, "roll")[0].Labels[controller.LabelPoolTemplate]

	editPool(t, pl, func(p *v1alpha1.ProxyPool) { p.Spec.Template.Spec.Attributes["tier"] = "b" })

	// on lists the pool's Proxies on the new template for which pending holds.
	on := func(pending func(v1alpha1.Proxy) bool) []v1alpha1.Proxy {
		var out []v1alpha1.Proxy
		for _, p := range members(t, ns, "roll") {
			if p.Labels[controller.LabelPoolTemplate] != oldHash && pending(p) {
				out = append(out, p)
			}
		}
		return out
	}
	unapplied := func(p v1alpha1.Proxy) bool { return p.Status.ObservedGeneration != p.Generation }
	notReady := func(p v1alpha1.Proxy) bool { return p.Status.Phase != v1alpha1.PhaseReady }
	for round := 1; round <= 4; round++ {
		var updating []v1alpha1.Proxy
		require.Eventually(t, func() bool { updating = on(unapplied); return len(updating) >= 1 },
			20*time.Second, 50*time.Millisecond, "round %d: no Proxy got the new template", round)
		// Held here: no second one may start while this one is not back.
		require.Never(t, func() bool { return len(on(unapplied)) > 1 }, 500*time.Millisecond, 50*time.Millisecond,
			"round %d: more than maxSurge at once", round)
		require.Len(t, updating, 1)
		assert.Equal(t, "b", string(updating[0].Spec.Attributes["tier"]))
		// Its workflow takes the spec and builds the replacement: Replacing, still Ready.
		serve(t, &updating[0], v1alpha1.PhaseReplacing)
		require.Never(t, func() bool { return len(on(notReady)) > 1 }, 300*time.Millisecond, 50*time.Millisecond,
			"round %d: a Replacing one is a surge instance", round)
		require.NoError(t, k.Client.Get(ctx, ctrlclient.ObjectKeyFromObject(&updating[0]), &updating[0]))
		serve(t, &updating[0], v1alpha1.PhaseReady)
	}
	require.Eventually(t, func() bool {
		var got v1alpha1.ProxyPool
		if k.Client.Get(ctx, ctrlclient.ObjectKeyFromObject(pl), &got) != nil {
			return false
		}
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.PoolConditionProgressing)
		return got.Status.UpdatedReplicas == 4 && got.Status.ReadyReplicas == 4 && c != nil && c.Status == metav1.ConditionFalse
	}, 20*time.Second, 50*time.Millisecond, "the rollout ends with every Proxy updated and Ready")
}

// TestPoolReplacesDeleteFirstWithoutSurge: maxSurge 0 replaces Proxies delete-first,
// maxUnavailable at a time, and never has more Proxies than replicas.
func TestPoolReplacesDeleteFirstWithoutSurge(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	startPoolController(t)
	ns := namespace(t)
	pl := pool(ns, "recycle", 3)
	pl.Spec.Strategy = v1alpha1.PoolStrategy{MaxSurge: ptr.To(intstr.FromInt32(0)), MaxUnavailable: ptr.To(intstr.FromInt32(1))}
	require.NoError(t, k.Client.Create(ctx, pl))
	require.Eventually(t, func() bool { return len(members(t, ns, "recycle")) == 3 }, 20*time.Second, 50*time.Millisecond)
	for _, p := range members(t, ns, "recycle") {
		serve(t, &p, v1alpha1.PhaseReady)
	}
	oldHash := members(t, ns, "recycle")[0].Labels[controller.LabelPoolTemplate]
	editPool(t, pl, func(p *v1alpha1.ProxyPool) { p.Spec.Template.Spec.Attributes["tier"] = "b" })

	deadline := time.Now().Add(60 * time.Second)
	for {
		ms := members(t, ns, "recycle")
		require.LessOrEqual(t, len(ms), 3, "never more Proxies than replicas: %v", names(ms))
		fresh, old, ready := 0, 0, 0
		for _, p := range ms {
			if meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionReady) {
				ready++
			}
		}
		require.GreaterOrEqual(t, ready, 2, "more than maxUnavailable down at once: %v", names(ms))
		for _, p := range ms {
			if p.Labels[controller.LabelPoolTemplate] == oldHash {
				old++
				continue
			}
			fresh++
			if p.Status.ObservedGeneration != p.Generation {
				serve(t, &p, v1alpha1.PhaseReady)
			}
		}
		if old == 0 && fresh == 3 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the rollout did not finish: %v", names(ms))
		time.Sleep(20 * time.Millisecond) // polling the API server, not synchronising
	}
}

// TestDeletingAPoolDeletesItsProxies: the pool goes only after its Proxies are gone, and
// they go only once their own finalizers (their workflows deleting the instances) let them.
func TestDeletingAPoolDeletesItsProxies(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	startPoolController(t)
	ns := namespace(t)
	pl := pool(ns, "gone", 2)
	require.NoError(t, k.Client.Create(ctx, pl))
	require.Eventually(t, func() bool { return len(members(t, ns, "gone")) == 2 }, 20*time.Second, 50*time.Millisecond)
	// The Proxies' workflows would hold them until their instances are deleted.
	hold := ctrlclient.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"metadata":{"finalizers":[%q]}}`, v1alpha1.Finalizer)))
	for _, p := range members(t, ns, "gone") {
		require.NoError(t, k.Client.Patch(ctx, &p, hold))
	}

	require.NoError(t, k.Client.Delete(ctx, pl))
	require.Eventually(t, func() bool {
		for _, p := range members(t, ns, "gone") {
			if p.DeletionTimestamp == nil {
				return false
			}
		}
		return true
	}, 20*time.Second, 50*time.Millisecond, "the pool deletes its Proxies")
	require.Never(t, func() bool {
		return apierrors.IsNotFound(k.Client.Get(ctx, ctrlclient.ObjectKeyFromObject(pl), &v1alpha1.ProxyPool{}))
	}, time.Second, 50*time.Millisecond, "the pool went while its Proxies (and instances) remained")

	release := ctrlclient.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
	for _, p := range members(t, ns, "gone") {
		require.NoError(t, k.Client.Patch(ctx, &p, release))
	}
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(k.Client.Get(ctx, ctrlclient.ObjectKeyFromObject(pl), &v1alpha1.ProxyPool{}))
	}, 20*time.Second, 50*time.Millisecond, "the pool is gone once its Proxies are")
}
