package controller_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/operator/controller"
)

// demandStub answers the demand and the listing the test sets, and remembers what it was
// asked.
type demandStub struct {
	mu      sync.Mutex
	demand  int
	err     error
	asked   []map[string]string
	proxies []dclient.ListedProxy
}

func (d *demandStub) ListProxies(_ context.Context, sel map[string]string, _ *bool) (*dclient.ProxyList, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil {
		return nil, d.err
	}
	return &dclient.ProxyList{Proxies: d.proxies, Count: len(d.proxies)}, nil
}

func (d *demandStub) set(n int, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.demand, d.err = n, err
}

func (d *demandStub) Demand(_ context.Context, sel map[string]string) (*dclient.Demand, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.asked = append(d.asked, sel)
	if d.err != nil {
		return nil, d.err
	}
	return &dclient.Demand{Selector: sel, Demand: d.demand, Held: d.demand, LeasedProxies: min(d.demand, 1), Replicas: 1}, nil
}

func autoscaled(ns, name string) *v1alpha1.ProxyPool {
	p := pool(ns, name, 0)
	p.Spec.Template.Spec.MaxLeases = 2
	p.Spec.Autoscale = &v1alpha1.PoolAutoscale{MinReplicas: ptr.To[int32](0), MaxReplicas: 5, TargetUtilization: 100,
		ScaleDownDelay: "1m"}
	return p
}

// autoscaledEU creates the autoscaled pool "eu" in a namespace of its own and returns an
// autoscaler over that namespace alone, writing through c, on a hand clock, reading
// demand from a stub the test sets.
func autoscaledEU(t *testing.T, c ctrlclient.Client) (string, *controller.Autoscaler, *demandStub, *testenv.Clock) {
	t.Helper()
	ns := namespace(t)
	require.NoError(t, testenv.Kube(t).Client.Create(context.Background(), autoscaled(ns, "eu")))
	demand := &demandStub{}
	clock := testenv.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	return ns, &controller.Autoscaler{Client: c, Demand: demand, Now: clock.Now, Namespace: ns}, demand, clock
}

func replicasOf(t *testing.T, ns, name string) int32 {
	t.Helper()
	var p v1alpha1.ProxyPool
	require.NoError(t, testenv.Kube(t).Client.Get(context.Background(), ctrlclient.ObjectKey{Namespace: ns, Name: name}, &p))
	return ptr.Deref(p.Spec.Replicas, -1)
}

func poolCondition(t *testing.T, ns, name, typ string) *metav1.Condition {
	t.Helper()
	var p v1alpha1.ProxyPool
	require.NoError(t, testenv.Kube(t).Client.Get(context.Background(), ctrlclient.ObjectKey{Namespace: ns, Name: name}, &p))
	return meta.FindStatusCondition(p.Status.Conditions, typ)
}

// TestAutoscalerFollowsDemand: a pool with spec.autoscale is sized by its demand as an
// HPA sizes a Deployment: nothing at zero demand with minReplicas 0, one proxy for the
// first waiting request, as many as demand fills at the target, held at maxReplicas (and
// saying so), and shrunk only once demand has stayed lower for scaleDownDelay. Its
// selector is the template's attributes; each change is an event with its reason, and the
// pool controller creates the Proxies it decided.
func TestAutoscalerFollowsDemand(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	mgr := startPoolController(t)
	ns := namespace(t)
	require.NoError(t, k.Client.Create(ctx, autoscaled(ns, "eu")))
	demand := &demandStub{}
	clock := testenv.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	a := &controller.Autoscaler{Client: k.Client, Events: mgr.GetEventRecorder("proxyfleet-operator"),
		Demand: demand, Now: clock.Now}

	require.NoError(t, a.Scale(ctx))
	assert.EqualValues(t, 0, replicasOf(t, ns, "eu"), "no demand, minReplicas 0: no proxy")
	assert.Equal(t, []map[string]string{{"region": "eu"}}, demand.asked, "the pool's selector is its template's attributes")
	active := poolCondition(t, ns, "eu", v1alpha1.PoolConditionScalingActive)
	require.NotNil(t, active)
	assert.Equal(t, metav1.ConditionTrue, active.Status)

	demand.set(1, nil)
	require.NoError(t, a.Scale(ctx))
	assert.EqualValues(t, 1, replicasOf(t, ns, "eu"), "the first request starts one")
	require.Eventually(t, func() bool { return len(members(t, ns, "eu")) == 1 }, 20*time.Second, 50*time.Millisecond)

	demand.set(7, nil)
	clock.Advance(5 * time.Second)
	require.NoError(t, a.Scale(ctx))
	assert.EqualValues(t, 4, replicasOf(t, ns, "eu"), "7 leases at 2 a proxy and 100%% want 4")

	demand.set(100, nil)
	clock.Advance(5 * time.Second)
	require.NoError(t, a.Scale(ctx))
	assert.EqualValues(t, 5, replicasOf(t, ns, "eu"))
	limited := poolCondition(t, ns, "eu", v1alpha1.PoolConditionScalingLimited)
	require.NotNil(t, limited)
	assert.Equal(t, metav1.ConditionTrue, limited.Status)
	assert.Equal(t, controller.ReasonTooMany, limited.Reason)
	var pl v1alpha1.ProxyPool
	require.NoError(t, k.Client.Get(ctx, ctrlclient.ObjectKey{Namespace: ns, Name: "eu"}, &pl))
	assert.EqualValues(t, 100, ptr.Deref(pl.Status.Demand, -1))

	// Demand falls: nothing shrinks within the minute, all of it after.
	demand.set(0, nil)
	clock.Advance(30 * time.Second)
	require.NoError(t, a.Scale(ctx))
	assert.EqualValues(t, 5, replicasOf(t, ns, "eu"), "within scaleDownDelay")
	clock.Advance(31 * time.Second)
	require.NoError(t, a.Scale(ctx))
	assert.EqualValues(t, 0, replicasOf(t, ns, "eu"), "demand stayed at zero for the delay")
	require.Eventually(t, func() bool { return len(activeMembers(t, ns, "eu")) == 0 }, 20*time.Second, 50*time.Millisecond)

	// Each decision is an event that says why.
	var lastNotes string
	defer func() {
		if t.Failed() {
			t.Logf("events:\n%s", lastNotes)
		}
	}()
	require.Eventually(t, func() bool {
		var list eventsv1.EventList
		require.NoError(t, k.Client.List(ctx, &list, ctrlclient.InNamespace(ns)))
		var notes []string
		for _, e := range list.Items {
			if e.Reason == controller.EventPoolAutoscaled && e.Type == corev1.EventTypeNormal {
				notes = append(notes, e.Note)
			}
		}
		joined := strings.Join(notes, "\n")
		lastNotes = joined
		return strings.Contains(joined, "scaled from 0 to 1 Proxies: demand 1 leases (held 1, waiting 0, refused 0) at 100% of 2 leases a proxy wants 1") &&
			strings.Contains(joined, "scaled from 1 to 4 Proxies: demand 7 leases") &&
			strings.Contains(joined, "scaled from 4 to 5 Proxies: demand 100 leases") &&
			strings.Contains(joined, "scaled from 5 to 0 Proxies: demand 0 leases")
	}, 20*time.Second, 50*time.Millisecond, "an event for each decision, with its reason")
}

// activeMembers are the pool's Proxies not being deleted.
func activeMembers(t *testing.T, ns, name string) []v1alpha1.Proxy {
	var out []v1alpha1.Proxy
	for _, p := range members(t, ns, name) {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// TestAutoscalerWithoutDemandKeepsTheSize: when the demand cannot be read (no discovery
// configured, or discovery not answering) the pool keeps its size and says why; a pool
// that loses spec.autoscale loses the autoscaler's conditions.
func TestAutoscalerWithoutDemandKeepsTheSize(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	startPoolController(t)
	ns := namespace(t)
	p := autoscaled(ns, "eu")
	p.Spec.Replicas = ptr.To[int32](2)
	require.NoError(t, k.Client.Create(ctx, p))

	none := &controller.Autoscaler{Client: k.Client}
	require.NoError(t, none.Scale(ctx))
	active := poolCondition(t, ns, "eu", v1alpha1.PoolConditionScalingActive)
	require.NotNil(t, active)
	assert.Equal(t, metav1.ConditionFalse, active.Status)
	assert.Equal(t, controller.ReasonNoDiscovery, active.Reason)
	assert.Contains(t, active.Message, "--discovery-url")
	assert.EqualValues(t, 2, replicasOf(t, ns, "eu"))

	demand := &demandStub{}
	demand.set(0, errors.New("connection refused"))
	failing := &controller.Autoscaler{Client: k.Client, Demand: demand}
	require.NoError(t, failing.Scale(ctx))
	active = poolCondition(t, ns, "eu", v1alpha1.PoolConditionScalingActive)
	require.NotNil(t, active)
	assert.Equal(t, controller.ReasonDemandUnreadable, active.Reason)
	assert.Contains(t, active.Message, "connection refused")
	assert.EqualValues(t, 2, replicasOf(t, ns, "eu"), "an unread demand is no demand")

	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur v1alpha1.ProxyPool
		if err := k.Client.Get(ctx, ctrlclient.ObjectKeyFromObject(p), &cur); err != nil {
			return err
		}
		cur.Spec.Autoscale = nil
		return k.Client.Update(ctx, &cur)
	}))
	require.Eventually(t, func() bool {
		return poolCondition(t, ns, "eu", v1alpha1.PoolConditionScalingActive) == nil
	}, 20*time.Second, 50*time.Millisecond, "the pool controller clears the autoscaler's conditions")
}

// TestAutoscalerWritesStatusSparingly: while the pool's size and conditions stay as they
// are, a change of its demand alone is written at most every 30 seconds: every look a
// status write (and a reconcile of the pool) would cost the API server for every busy pool.
func TestAutoscalerWritesStatusSparingly(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	ns, a, demand, clock := autoscaledEU(t, k.Client)
	statusDemand := func() int32 {
		var p v1alpha1.ProxyPool
		require.NoError(t, k.Client.Get(ctx, ctrlclient.ObjectKey{Namespace: ns, Name: "eu"}, &p))
		return ptr.Deref(p.Status.Demand, -1)
	}

	demand.set(3, nil)
	require.NoError(t, a.Scale(ctx))
	assert.EqualValues(t, 2, replicasOf(t, ns, "eu"))
	assert.EqualValues(t, 3, statusDemand())

	demand.set(4, nil) // still two proxies of two leases
	clock.Advance(5 * time.Second)
	require.NoError(t, a.Scale(ctx))
	assert.EqualValues(t, 3, statusDemand(), "the same size and conditions: not written again so soon")

	clock.Advance(30 * time.Second)
	require.NoError(t, a.Scale(ctx))
	assert.EqualValues(t, 4, statusDemand(), "written once 30 s have passed")

	demand.set(5, nil) // three proxies now: written at once
	clock.Advance(5 * time.Second)
	require.NoError(t, a.Scale(ctx))
	assert.EqualValues(t, 3, replicasOf(t, ns, "eu"))
	assert.EqualValues(t, 5, statusDemand())
}
