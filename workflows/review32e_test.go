package workflows

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// review32eHashes makes the harness build from a cloud-init Secret whose n-th hash
// (1-based) is hashes[n-1], the last one repeating; "" fails that call as an API server
// that does not answer would. Create reports the data it built from as the last hash.
func review32eHashes(hashes ...string) func(*harness) {
	return func(h *harness) {
		acts := &activities.Activities{}
		real := &activities.Activities{Providers: h.reg, Installation: "test", Keyring: testKeys}
		var mu sync.Mutex
		calls, cur := 0, ""
		h.env.OnActivity(acts.CreateInstance, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.InstanceInput) (activities.CreateResult, error) {
			in.Spec.CloudInit = nil
			res, err := real.CreateInstance(ctx, in)
			mu.Lock()
			res.SecretHash = cur
			mu.Unlock()
			return res, err
		})
		h.env.OnActivity(acts.HashCloudInit, mock.Anything, mock.Anything).Return(func(context.Context, activities.HashInput) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			v := hashes[min(calls, len(hashes))-1]
			if v == "" {
				return "", errors.New("the API server is unavailable")
			}
			cur = v
			return v, nil
		})
	}
}

func review32eBooted(s *v1alpha1.ProxySpec) {
	s.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "boot", Key: "startup-script"}}
}

// TestReview32eHeldRotationAfterAHashRetrySpins: a pool member's run reads the rotated
// Secret; the read fails once (its local activity's 5 attempts: an API server restart),
// which sets RetryAt, and succeeds on the retry. hashed() does not clear RetryAt (only a
// provider step's success does), and before this change the rotation went on to
// createNext, whose created() cleared it. Now the member is held for its pool: plan
// returns stepSteady with RetryAt in the past, steady's wake is that past RetryAt, its
// timer is 0 and fires at once, woke(retry) does nothing, and the loop plans steady
// again: the run never yields, starts ~1,600 zero timers at one workflow instant and
// continues as new, carrying the stale RetryAt into the next run, which does the same —
// a storm of continue-as-new runs until the pool's grant (requestReplace clears RetryAt)
// happens to arrive, which with maxSurge 1 and many members asking can be hours.
func TestReview32eHeldRotationAfterAHashRetrySpins(t *testing.T) {
	h := newHarness(t, review32eHashes("h1", "", "", "", "", "", "h2"))
	h.signalAt(0, contract.SignalSpec, SpecSignal{UID: h.uid, Generation: 1, SecretVersion: "100", Spec: h.spec(review32eBooted), Pool: "eu"})
	// The Secret is rotated: the Proxy controller sends its new version.
	h.signalAt(20*time.Minute, contract.SignalSpec, SpecSignal{UID: h.uid, Generation: 1, SecretVersion: "101", Spec: h.spec(review32eBooted), Pool: "eu"})
	h.checkAt(2*time.Hour, func() {
		st := h.queryState()
		if assert.NotNil(t, st.Asked, "the member asks its pool for the rotation") {
			assert.Equal(t, v1alpha1.ReasonCloudInit, st.Asked.Cause)
		}
	})
	h.signalAt(3*time.Hour, contract.SignalDelete, contract.DeleteSignal{UID: h.uid})
	h.run(fastTuning())
	assert.Less(t, h.rec.runCounts.timers, 100, "a member that waits for its pool's grant must wait, not start timers in a loop")
	h.requireCompleted() // not continued as new at the moment it started waiting
}

// TestReview32eHeldSteadyWakesAtOnce: the pure core of the spin above. A member held for
// its pool's grant with a RetryAt already past (a hash retried with success, which leaves
// RetryAt as it was) plans stepSteady and wakes at that past time: the loop's wait returns
// at once, again and again.
func TestReview32eHeldSteadyWakesAtOnce(t *testing.T) {
	s := pooledState(review32eBooted)
	s.SecretVersion, s.SecretHash = "100", "h1"
	s.Instance.Hash = DesiredHash(s.Spec, "h1")
	s.applySpec(SpecSignal{UID: s.UID, Generation: s.Generation, SecretVersion: "101", Spec: *s.Spec, Pool: s.Pool})
	require.Equal(t, stepHash, plan(&s, t0))
	// The hash fails (the local activity's retries spent) and is retried after RetryAt.
	s.failed(failTransient, "the API server is unavailable", t0, tuning0)
	at := s.RetryAt
	require.Equal(t, stepSteady, plan(&s, t0))
	require.Equal(t, stepHash, plan(&s, at))
	s.hashed("h2")
	s.askRotation(at)
	require.NotNil(t, s.Asked)

	now := at.Add(time.Second)
	require.Equal(t, stepSteady, plan(&s, now), "held for the pool's grant")
	wake, why := s.nextWake(now)
	assert.True(t, wake.IsZero() || wake.After(now),
		"a steady run must not wake at a time already past (%s, %s): it would never yield", wake, why)
}
