package workflows

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestReview2FailingDeletesDoNotMultiplyInstances: the worker loses the right to delete
// instances (IAM revoked, an org policy turns on deletion protection, a webhook refuses pod
// deletes): every delete fails, and is retried with backoff. liveWhileDeleting lets the
// plan go on with the live instances meanwhile, which includes optional replacements: every
// maxAge a new instance is created and the old one joins Retiring, never to be deleted.
// Before, the Proxy held its instances while deletes failed; now each Proxy gains one
// billed instance per maxAge for as long as the outage lasts (a fleet of 10,000 with
// maxAge 1h: 240,000 VMs a day).
func TestReview2FailingDeletesDoNotMultiplyInstances(t *testing.T) {
	var h *harness
	deletesFail := true
	h = newHarness(t, func(hh *harness) {
		acts := &activities.Activities{}
		hh.env.OnActivity(acts.DeleteInstance, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.InstanceInput) error {
			if deletesFail {
				return temporal.NewApplicationError("permission compute.instances.delete denied", "", errors.New("403"))
			}
			return hh.prov.Delete(ctx, in.ProviderID)
		})
	})
	h.specAt(0, 1, h.spec(func(s *v1alpha1.ProxySpec) {
		s.Lifecycle = &v1alpha1.Lifecycle{MaxAge: ptr(v1alpha1.Duration("10m"))}
	}))
	h.checkAt(5*time.Minute, func() {
		assert.Len(t, h.prov.names(), 1, "control: one instance before deletes are needed")
	})
	h.checkAt(3*time.Hour, func() {
		names := h.prov.names()
		assert.LessOrEqual(t, len(names), 3, "while deletes fail, replacements go on and every old instance is kept: %v", names)
		deletesFail = false
	})
	h.signalAt(4*time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	tuning := fastTuning()
	tuning.MaxRunAge = 5 * time.Hour
	// Hours of failing deletes are many events; the run must last the test (the test
	// environment ends at a continue-as-new).
	tuning.HistoryLimit = 1 << 20
	h.run(tuning)
	require.NoError(t, h.env.GetWorkflowError())
	assert.Equal(t, h.checks, h.ran, "some checks never ran")
}
