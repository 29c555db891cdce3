package controller_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/operator/controller"
)

// TestReview32AutoscalerSurvivesASilentDiscovery: discovery (or whatever is behind its
// Service) accepts the autoscaler's request for one pool's demand and never answers.
// The operator's client has no timeout and the pass has no deadline, so the whole pass
// hangs on that pool: it never says DemandUnreadable (docs: "when discovery does not
// answer, ScalingActive=False DemandUnreadable"), and every other pool, whose demand
// discovery answers at once, is never sized again.
func TestReview32AutoscalerSurvivesASilentDiscovery(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	ns := namespace(t)
	a := autoscaled(ns, "a")
	a.Spec.Template.Spec.Attributes = map[string]v1alpha1.AttributeValue{"pool": "a"}
	b := autoscaled(ns, "b")
	b.Spec.Template.Spec.Attributes = map[string]v1alpha1.AttributeValue{"pool": "b"}
	require.NoError(t, k.Client.Create(ctx, a))
	require.NoError(t, k.Client.Create(ctx, b))

	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("attr.pool") == "a" {
			select { // a stuck replica: the connection is open, no answer comes
			case <-stop:
			case <-r.Context().Done():
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"selector":{"pool":"b"},"proxies":0,"healthy":0,"capacity":0,"held":0,"leasedProxies":0,"waiting":4,"refused":0,"demand":4,"replicas":1}`))
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) })

	scaler := &controller.Autoscaler{Client: k.Client, Demand: dclient.New(srv.URL, "operator-token-0123456789"), Namespace: ns}
	passCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = scaler.Scale(passCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	assert.Eventually(t, func() bool {
		return replicasOf(t, ns, "b") == 2
	}, 20*time.Second, 50*time.Millisecond, "pool b (demand 4, 2 leases a proxy) is never sized: the pass hangs on pool a")
	assert.Eventually(t, func() bool {
		active := poolCondition(t, ns, "a", v1alpha1.PoolConditionScalingActive)
		return active != nil && active.Reason == controller.ReasonDemandUnreadable
	}, 20*time.Second, 50*time.Millisecond, "pool a never says it could not read its demand")
}

// TestReview32OutageDoesNotShrinkAtOnce: scaleDownDelay is "how long demand must stay
// lower before the pool shrinks" and a restart "never causes" a shrink. When discovery
// cannot be read for longer than the delay (an outage, or discovery restarting with its
// leases and waiters forgotten), the first answer after it shrinks the pool at once on one
// reading: the remembered window has expired, and nothing counts the pool's size as
// wanted meanwhile.
func TestReview32OutageDoesNotShrinkAtOnce(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	ns, a, demand, clock := autoscaledEU(t, k.Client) // 2 leases a proxy, 100%, delay 1m, 0..5

	demand.set(8, nil)
	require.NoError(t, a.Scale(ctx))
	require.EqualValues(t, 4, replicasOf(t, ns, "eu"))

	// Discovery does not answer for two minutes, every 5 s.
	demand.set(0, errors.New("connection refused"))
	for range 24 {
		clock.Advance(5 * time.Second)
		require.NoError(t, a.Scale(ctx))
	}
	require.EqualValues(t, 4, replicasOf(t, ns, "eu"), "an unread demand keeps the size")
	active := poolCondition(t, ns, "eu", v1alpha1.PoolConditionScalingActive)
	require.NotNil(t, active)
	require.Equal(t, metav1.ConditionFalse, active.Status)

	// It answers again, with low demand (it restarted and lost its waiters and refusals).
	demand.set(0, nil)
	clock.Advance(5 * time.Second)
	require.NoError(t, a.Scale(ctx))
	assert.EqualValues(t, 4, replicasOf(t, ns, "eu"),
		"one reading after an outage shrank the pool: demand has not stayed lower for scaleDownDelay")
}

// TestReview32NoCredentialInConditions: a --discovery-url with credentials in it (an
// ingress with basic authentication in front of discovery) and a typo in its port: the
// ScalingActive message, the operator's log line and every pass carry the password, as
// net/url's parse error quotes the URL whole. The http.Client redacts it for a failed
// request (op:***@); the request that cannot even be built does not.
func TestReview32NoCredentialInConditions(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	ns := namespace(t)
	require.NoError(t, k.Client.Create(ctx, autoscaled(ns, "eu")))
	const secret = "hunter2-Zq8-secret"
	a := &controller.Autoscaler{Client: k.Client, Namespace: ns,
		Demand: dclient.New("http://operator:"+secret+"@proxyfleet-discovery:80g90", "operator-token-0123456789")}
	require.NoError(t, a.Scale(ctx))
	active := poolCondition(t, ns, "eu", v1alpha1.PoolConditionScalingActive)
	require.NotNil(t, active)
	assert.Equal(t, controller.ReasonDemandUnreadable, active.Reason)
	assert.False(t, strings.Contains(active.Message, secret), "the condition shows the password: %s", active.Message)
}

// slowDemand answers every pool's demand after a delay (a discovery replica set with one
// replica hung: each GET /v1/demand waits the peer timeout, 2 s, for its part), and
// pool z's with its demand.
type slowDemand struct {
	demandStub
	delay time.Duration
}

func (d *slowDemand) Demand(ctx context.Context, sel map[string]string) (*dclient.Demand, error) {
	select {
	case <-time.After(d.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	n := 0
	if sel["pool"] == "z" {
		n = 2
	}
	return &dclient.Demand{Selector: sel, Demand: n, Waiting: n, Replicas: 2, Partial: true}, nil
}

// TestReview32FirstRequestWaitsOneInterval: docs/operations.md: the autoscaler's look is
// "≤ 5s" of a cold start, and --autoscale-interval is "the most it adds to the first
// request of a pool scaled to zero". The pass asks each pool in turn, so a slow answer
// (here 1 s, a replica set with a hung replica answers after its 2 s peer timeout) is paid
// once per pool before the last pool is looked at: with eight other pools, a crawler
// waiting on pool z waits 8 s for the look that starts its proxy.
func TestReview32FirstRequestWaitsOneInterval(t *testing.T) {
	k := testenv.Kube(t)
	ctx := context.Background()
	ns := namespace(t)
	for _, name := range []string{"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "z"} {
		p := autoscaled(ns, name)
		p.Spec.Template.Spec.Attributes = map[string]v1alpha1.AttributeValue{"pool": v1alpha1.AttributeValue(name)}
		require.NoError(t, k.Client.Create(ctx, p))
	}
	a := &controller.Autoscaler{Client: k.Client, Demand: &slowDemand{delay: time.Second}, Namespace: ns,
		Interval: controller.DefaultAutoscaleInterval}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Start(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	assert.Eventually(t, func() bool { return replicasOf(t, ns, "z") == 1 }, controller.DefaultAutoscaleInterval+time.Second,
		20*time.Millisecond, "pool z's waiting crawler is not looked at within one --autoscale-interval")
}
