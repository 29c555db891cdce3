package workflows

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestStatusIsRepublishedAfterAnAPIOutage: a change made while the API server is down is
// written once it is back, although nothing else changes afterwards.
func TestStatusIsRepublishedAfterAnAPIOutage(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	h.checkAt(10*time.Minute, func() { h.setAPIDown(true) })
	// A new generation (attributes only: no new instance) while the API is down.
	h.specAt(11*time.Minute, 2, h.spec(func(s *v1alpha1.ProxySpec) {
		s.Attributes = map[string]v1alpha1.AttributeValue{"region": "eu"}
	}))
	h.checkAt(15*time.Minute, func() {
		assert.Equal(t, int64(1), h.lastStatus().ObservedGeneration, "not written while the API is down")
		h.setAPIDown(false)
	})
	h.checkAt(30*time.Minute, func() {
		assert.Equal(t, int64(2), h.lastStatus().ObservedGeneration, "written once the API is back")
		assert.Equal(t, v1alpha1.PhaseReady, h.lastStatus().Phase)
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
}

// TestFinalizerReleaseWaitsOutAnAPIOutage: a deletion that finishes while the API server is
// down for many minutes waits for it, instead of failing the workflow and leaving the Proxy
// stuck with its finalizer.
func TestFinalizerReleaseWaitsOutAnAPIOutage(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	h.checkAt(10*time.Minute, func() { h.setAPIDown(true) })
	h.signalAt(11*time.Minute, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.checkAt(40*time.Minute, func() {
		assert.False(t, h.env.IsWorkflowCompleted(), "still waiting for the API")
		assert.Empty(t, h.prov.names(), "the instance was deleted meanwhile")
		h.setAPIDown(false)
	})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Equal(t, 1, h.released)
	assert.Greater(t, h.env.Now().Sub(h.start), 40*time.Minute)
}
