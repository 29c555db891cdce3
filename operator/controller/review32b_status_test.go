package controller_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/operator/controller"
)

// TestReview32bRecoveryIsWrittenAtOnce: the unread-demand path writes
// ScalingActive=False DemandUnreadable without telling statusDue, whose memory still
// says "True DemandRead" from the look before. When discovery answers again the next
// look finds the shape unchanged, the counts younger than 30 s, and writes nothing: the
// pool says DemandUnreadable for up to 30 s after discovery came back.
func TestReview32bRecoveryIsWrittenAtOnce(t *testing.T) {
	ctx := context.Background()
	ns, a, demand, clock := autoscaledEU(t, testenv.Kube(t).Client)

	demand.set(8, nil)
	require.NoError(t, a.Scale(ctx))
	require.EqualValues(t, 4, replicasOf(t, ns, "eu"))

	demand.set(0, errors.New("connection refused"))
	clock.Advance(5 * time.Second)
	require.NoError(t, a.Scale(ctx))
	active := poolCondition(t, ns, "eu", v1alpha1.PoolConditionScalingActive)
	require.NotNil(t, active)
	require.Equal(t, controller.ReasonDemandUnreadable, active.Reason)

	demand.set(8, nil)
	clock.Advance(5 * time.Second)
	require.NoError(t, a.Scale(ctx))
	active = poolCondition(t, ns, "eu", v1alpha1.PoolConditionScalingActive)
	require.NotNil(t, active)
	assert.Equal(t, metav1.ConditionTrue, active.Status,
		"discovery answers again, the pool still says %s: %s", active.Reason, active.Message)
}

// failingStatus fails the status writes while fail is set.
type failingStatus struct {
	ctrlclient.Client
	fail *atomic.Bool
}

func (c failingStatus) Status() ctrlclient.SubResourceWriter {
	return failingWriter{c.Client.Status(), c.fail}
}

type failingWriter struct {
	ctrlclient.SubResourceWriter
	fail *atomic.Bool
}

func (w failingWriter) Patch(ctx context.Context, obj ctrlclient.Object, patch ctrlclient.Patch, opts ...ctrlclient.SubResourcePatchOption) error {
	if w.fail.Load() {
		return errors.New("apiserver unavailable")
	}
	return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// TestReview32bFailedStatusWriteIsRetried: statusDue records a write (its time and the
// conditions' shape) before the write is tried. When the write fails, the next look
// believes the new conditions are on the pool and skips the write for 30 s: a pool
// no longer limited goes on saying ScalingLimited=True TooManyReplicas.
func TestReview32bFailedStatusWriteIsRetried(t *testing.T) {
	ctx := context.Background()
	fail := &atomic.Bool{}
	ns, a, demand, clock := autoscaledEU(t, failingStatus{testenv.Kube(t).Client, fail}) // 0..5, 2 leases a proxy

	demand.set(20, nil) // 10 wanted: held at 5
	require.NoError(t, a.Scale(ctx))
	require.EqualValues(t, 5, replicasOf(t, ns, "eu"))
	limited := poolCondition(t, ns, "eu", v1alpha1.PoolConditionScalingLimited)
	require.NotNil(t, limited)
	require.Equal(t, controller.ReasonTooMany, limited.Reason)

	// Demand falls to exactly the pool's size: no resize, the limit no longer holds. The
	// status write of that look fails.
	demand.set(10, nil)
	fail.Store(true)
	clock.Advance(5 * time.Second)
	_ = a.Scale(ctx)
	fail.Store(false)

	clock.Advance(5 * time.Second)
	require.NoError(t, a.Scale(ctx))
	limited = poolCondition(t, ns, "eu", v1alpha1.PoolConditionScalingLimited)
	require.NotNil(t, limited)
	assert.Equal(t, controller.ReasonWithinRange, limited.Reason,
		"the write that failed is not tried again: the pool says %s: %s", limited.Reason, limited.Message)
}
