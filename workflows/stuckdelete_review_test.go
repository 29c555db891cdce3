package workflows

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestReviewAnUndeletableOldInstanceDoesNotKeepTheProxyDown: after a replacement, the old
// instance cannot be deleted (someone turned on GCE deletion protection on it, a pod's
// finalizer never clears, the worker lost IAM on it): every delete fails, and with the new
// per-delete backoff plan() answers "steady" until DeleteRetryAt, before it looks at the
// live instances at all. Then the serving instance is lost. createFirst only skips the
// deletes when every retiring instance was lost, which the undeletable one was not: no
// instance is created while the old one refuses to go, which is forever. One stuck VM
// keeps the Proxy down (and also holds off maxAge, spec and ban replacements).
func TestReviewAnUndeletableOldInstanceDoesNotKeepTheProxyDown(t *testing.T) {
	h := newHarness(t, func(h *harness) {
		acts := &activities.Activities{}
		h.env.OnActivity(acts.DeleteInstance, mock.Anything, mock.MatchedBy(func(in activities.InstanceInput) bool {
			return in.Name == InstanceName(h.uid, 1)
		})).Return(temporal.NewApplicationError("instance px-1 has deletion protection enabled", "", errors.New("400")))
		h.env.OnActivity(acts.DeleteInstance, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.InstanceInput) error {
			return h.prov.Delete(ctx, in.ProviderID)
		})
		// Instance 2, which took over, vanishes 40 minutes in.
		h.shard.models = append(h.shard.models, func(in activities.MonitorInput) (activities.MonitorResult, time.Duration, bool) {
			if in.Instance == nil || in.Instance.Name != InstanceName(h.uid, 2) || !in.Last.Known {
				return activities.MonitorResult{}, 0, false
			}
			return activities.MonitorResult{Reason: activities.MonitorGone, Health: activities.Health{Known: true, Healthy: true}},
				max(h.start.Add(40*time.Minute).Sub(h.env.Now()), 0), true
		})
	})
	h.specAt(0, 1, h.spec())
	h.signalAt(20*time.Minute, contract.SignalReplace, contract.ReplaceSignal{Reason: "manual"})
	h.checkAt(39*time.Minute, func() {
		assert.Equal(t, InstanceName(h.uid, 2), h.lastStatus().InstanceName, "instance 2 took over")
	})
	h.env.RegisterDelayedCallback(func() {
		_ = h.prov.Delete(context.Background(), "fake/"+InstanceName(h.uid, 2))
	}, 39*time.Minute+30*time.Second)
	h.checkAt(70*time.Minute, func() {
		assert.NotEqual(t, -1, h.prov.opIndex("create "+InstanceName(h.uid, 3)),
			"half an hour after its instance was lost the Proxy still has none, waiting on an unrelated delete: %v", h.prov.ops)
	})
	h.signalAt(80*time.Minute, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	tuning := fastTuning()
	tuning.MaxRunAge = 90 * time.Minute
	h.run(tuning)
	assert.Equal(t, h.checks, h.ran, "some checks never ran")
}
