package workflows

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// leftBehind puts instances into h's provider as an earlier run of the same Proxy would have
// left them: labelled with the Proxy's UID, the installation, the fleet key their
// credentials come from, and (when hash is set) the spec hash they were built from.
func (h *harness) leftBehind(hash string, names ...string) {
	h.leftBehindKeyed(hash, testKeys.PrimaryID(), names...)
}

// leftBehindKeyed is leftBehind with the fleet key's ID; "" is an instance built before
// instances had credentials.
func (h *harness) leftBehindKeyed(hash, keyID string, names ...string) {
	h.prov.mu.Lock()
	defer h.prov.mu.Unlock()
	for _, name := range names {
		labels := provider.CreateRequest{ProxyUID: h.uid, Installation: "test", SpecHash: hash, KeyID: keyID}.Labels()
		h.prov.instances[name] = provider.Instance{Name: name, ProviderID: "fake/" + name, State: provider.StateRunning,
			IP: "127.0.0.1", Port: 3128, Labels: labels}
	}
}

func (h *harness) creates() int { return strings.Count(strings.Join(h.prov.ops, ","), "create ") }

// TestFreshRunAdoptsWhatEarlierRunsLeft: a run terminated by hand left instance 4 serving
// and 3 not yet deleted. The run the controller starts again adopts 4 as it is, deletes 3,
// creates nothing, and numbers new instances after 4.
func TestFreshRunAdoptsWhatEarlierRunsLeft(t *testing.T) {
	h := newHarness(t)
	spec := h.spec()
	h.leftBehind(DesiredHash(&spec, ""), InstanceName(h.uid, 3), InstanceName(h.uid, 4))
	h.specAt(0, 1, spec)
	h.checkAt(10*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 4)}, h.prov.names())
		st := h.lastStatus()
		assert.Equal(t, v1alpha1.PhaseReady, st.Phase)
		assert.Equal(t, InstanceName(h.uid, 4), st.InstanceName)
	})
	h.signalAt(20*time.Minute, contract.SignalReplace, contract.ReplaceSignal{Reason: "manual"})
	h.checkAt(30*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 5)}, h.prov.names(), "the replacement takes the next free number")
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Equal(t, 1, h.creates(), "only the replacement was created: %v", h.prov.ops)
	assert.Empty(t, h.prov.names())
}

// TestFreshRunReplacesAnInstanceOfAnotherSpec: the instance left behind was built from an
// older spec: it keeps serving until its replacement is verified.
func TestFreshRunReplacesAnInstanceOfAnotherSpec(t *testing.T) {
	h := newHarness(t)
	h.leftBehind("0123456789abcdef", InstanceName(h.uid, 2))
	h.specAt(0, 1, h.spec())
	h.checkAt(30*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 3)}, h.prov.names())
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	h.makeBeforeBreak(2, 3)
}

// TestInstanceWithoutCredentialsIsReplaced: an instance built before instances had
// credentials (no fleet key label; it takes anyone) is adopted, keeps serving, and is
// replaced make-before-break by one that requires credentials.
func TestInstanceWithoutCredentialsIsReplaced(t *testing.T) {
	h := newHarness(t)
	spec := h.spec()
	h.leftBehindKeyed(DesiredHash(&spec, ""), "", InstanceName(h.uid, 2))
	h.specAt(0, 1, spec)
	h.checkAt(30*time.Minute, func() {
		assert.Equal(t, []string{InstanceName(h.uid, 3)}, h.prov.names())
		st := h.lastStatus()
		assert.Equal(t, v1alpha1.PhaseReady, st.Phase)
		assert.Equal(t, InstanceName(h.uid, 3), st.InstanceName)
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	h.makeBeforeBreak(2, 3)
}

// TestFreshRunThatOnlyDeletes: the workflow was terminated and the Proxy deleted; the
// controller starts a run with the delete alone. It deletes what it finds, then releases
// the finalizer.
func TestFreshRunThatOnlyDeletes(t *testing.T) {
	h := newHarness(t)
	h.leftBehind("", InstanceName(h.uid, 1), InstanceName(h.uid, 2))
	h.signalAt(0, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Empty(t, h.prov.names(), "nothing left behind")
	assert.Zero(t, h.creates())
	assert.Equal(t, 1, h.released)
}

// TestContinuedRunDoesNotList: listing is for runs that start without state; a run
// continued as new knows its instances.
func TestContinuedRunDoesNotList(t *testing.T) {
	h := newHarness(t)
	h.specAt(0, 1, h.spec())
	tuning := fastTuning()
	tuning.MaxRunAge = time.Hour
	h.run(tuning)
	next := h.continuedAs()
	assert.False(t, next.State.Unlisted)
	require.NotNil(t, next.State.Instance)
}

// TestWorkerWithoutTheProviderDoesNotLatchFailed: during a rolling change of --providers
// the worker that takes a create may lack the provider. The Proxy waits and retries; it
// does not latch Failed, and is created once a worker has the provider.
func TestWorkerWithoutTheProviderDoesNotLatchFailed(t *testing.T) {
	h := newHarness(t)
	delete(h.reg, v1alpha1.ProviderLocal)
	h.specAt(0, 1, h.spec())
	h.checkAt(10*time.Minute, func() {
		st := h.lastStatus()
		assert.NotEqual(t, v1alpha1.PhaseFailed, st.Phase)
		assert.Contains(t, condition(st, v1alpha1.ConditionProvisioned).Message, "not configured on this worker")
		h.reg[v1alpha1.ProviderLocal] = h.prov
	})
	h.checkAt(30*time.Minute, func() {
		assert.Equal(t, v1alpha1.PhaseReady, h.lastStatus().Phase)
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	h.requireCompleted()
	assert.Empty(t, h.prov.names())
}

// TestAnotherObjectsSpecDuringTheListAdoptsNothing: while a run that started without state
// is listing object A's instances, a spec for object B (A was replaced without its delete
// reaching us) arrives. A's instances must not become B's.
func TestAnotherObjectsSpecDuringTheListAdoptsNothing(t *testing.T) {
	h := newHarness(t, func(h *harness) {
		acts := &activities.Activities{Providers: h.reg, Installation: "test", Keyring: testKeys}
		h.env.OnActivity(acts.FindInstances, mock.Anything, mock.Anything).After(time.Minute).Return(
			func(ctx context.Context, in activities.FindInput) (activities.FindResult, error) {
				return acts.FindInstances(ctx, in)
			})
	})
	h.leftBehind("", InstanceName(h.uid, 1))
	h.specAt(0, 1, h.spec())
	other := SpecSignal{UID: "uid-2", Generation: 1, Spec: h.spec()}
	h.signalAt(30*time.Second, contract.SignalSpec, other)
	h.checkAt(10*time.Minute, func() {
		st := h.queryState()
		assert.Equal(t, "uid-2", st.UID)
		if assert.NotNil(t, st.Instance) {
			assert.Equal(t, InstanceName("uid-2", 1), st.Instance.Name, "B got its own instance")
		}
		assert.Contains(t, h.prov.names(), InstanceName(h.uid, 1), "A's instance was not taken over (GC's to sweep)")
	})
	h.signalAt(time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: "uid-2"})
	h.run(fastTuning())
	h.requireCompleted()
}
