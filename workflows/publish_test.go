package workflows

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// published is what publication decides for state s after last was written: whether to
// write, and the write.
func published(s *ProxyState, p runPolicy, last written, dirty bool) (publication, bool) {
	s.policy = p
	v := view{state: s, in: ProxyWorkflowInput{Name: "px", Namespace: "ns"}, policy: p, tuning: tuning0}
	return v.publication(status(s, "wf"), last, dirty, t0)
}

// serving is steadyState with an instance that has credentials, as every instance built
// since versionCredentials has.
func serving() ProxyState {
	s := steadyState()
	s.Instance.KeyID = "k1"
	return s
}

// TestPublication: what a run writes is decided from the state and what it wrote last, so
// each rule is checked here without Temporal: nothing is written twice, a watch or a
// verdict only when it changes, and who may lease what.
func TestPublication(t *testing.T) {
	latest := policyFor(versionLatest)
	first := func(s ProxyState, p runPolicy) written {
		pub, ok := published(&s, p, written{}, false)
		require.True(t, ok)
		return pub.next
	}

	t.Run("the first write carries the memo, the watch and the verdict", func(t *testing.T) {
		s := serving()
		pub, ok := published(&s, latest, written{}, false)
		require.True(t, ok)
		assert.Equal(t, v1alpha1.PhaseReady, pub.phase)
		assert.True(t, pub.healthy)
		assert.Equal(t, "local", pub.provider)
		memo := pub.fields[contract.MemoKey].(contract.ProxyMemo)
		assert.Equal(t, "px", memo.Name)
		assert.Equal(t, "127.0.0.1", memo.IP)
		watch, _ := pub.fields[activities.MonitorMemoKey].(*activities.MonitorMemo)
		require.NotNil(t, watch)
		assert.Equal(t, "127.0.0.1:3128", watch.Input.Target)
		verdict, _ := pub.fields[activities.VerdictMemoKey].(*activities.Verdict)
		require.NotNil(t, verdict)
		assert.Equal(t, watch.Epoch, verdict.Epoch)
		assert.True(t, pub.next.watchSet)
		assert.Equal(t, watch.Epoch, pub.next.watchEpoch)
	})

	t.Run("nothing changed: nothing written", func(t *testing.T) {
		s := serving()
		last := first(s, latest)
		_, ok := published(&s, latest, last, false)
		assert.False(t, ok)
	})

	t.Run("a report's cooldowns: the memo again, not the watch or the verdict", func(t *testing.T) {
		s := serving()
		last := first(s, latest)
		pub, ok := published(&s, latest, last, true)
		require.True(t, ok)
		assert.Contains(t, pub.fields, contract.MemoKey)
		assert.NotContains(t, pub.fields, activities.MonitorMemoKey)
		assert.NotContains(t, pub.fields, activities.VerdictMemoKey)
	})

	t.Run("a verdict flip: the verdict, not the watch", func(t *testing.T) {
		s := serving()
		last := first(s, latest)
		s.Health = activities.Health{Known: true, Healthy: false, LastFailure: "refused"}
		pub, ok := published(&s, latest, last, false)
		require.True(t, ok)
		assert.False(t, pub.healthy)
		assert.Equal(t, v1alpha1.PhaseUnhealthy, pub.phase)
		assert.NotContains(t, pub.fields, activities.MonitorMemoKey, "the watch is the same epoch")
		verdict, _ := pub.fields[activities.VerdictMemoKey].(*activities.Verdict)
		require.NotNil(t, verdict)
		assert.False(t, verdict.Healthy)
	})

	t.Run("a new instance: a new watch", func(t *testing.T) {
		s := serving()
		last := first(s, latest)
		s.Instance = runningRef("b", s.Spec)
		s.Instance.KeyID = "k1"
		s.Instance.IP = "127.0.0.2"
		pub, ok := published(&s, latest, last, false)
		require.True(t, ok)
		watch, _ := pub.fields[activities.MonitorMemoKey].(*activities.MonitorMemo)
		require.NotNil(t, watch)
		assert.NotEqual(t, last.watchEpoch, watch.Epoch)
		assert.Equal(t, "127.0.0.2:3128", watch.Input.Target)
	})

	t.Run("deleting: the watch and the verdict are removed", func(t *testing.T) {
		s := serving()
		last := first(s, latest)
		s.Deleting = true
		pub, ok := published(&s, latest, last, false)
		require.True(t, ok)
		assert.Contains(t, pub.fields, activities.MonitorMemoKey)
		assert.Nil(t, pub.fields[activities.MonitorMemoKey])
		assert.Contains(t, pub.fields, activities.VerdictMemoKey)
		assert.Nil(t, pub.fields[activities.VerdictMemoKey])
		assert.False(t, pub.healthy)
		assert.Equal(t, "", pub.next.watchEpoch)
	})

	t.Run("runs not watched by shards publish no watch", func(t *testing.T) {
		s := serving()
		pub, ok := published(&s, policyFor(versionLostFirst), written{}, false)
		require.True(t, ok)
		assert.NotContains(t, pub.fields, activities.MonitorMemoKey)
		assert.NotContains(t, pub.fields, activities.VerdictMemoKey)
		last := pub.next
		_, ok = published(&s, policyFor(versionLostFirst), last, false)
		assert.False(t, ok)
	})

	replacing := func() ProxyState {
		s := serving()
		s.Next = &InstanceRef{Name: "b", Created: true}
		return s
	}
	t.Run("make-before-break for crawlers: the replaced instance stays leasable while healthy", func(t *testing.T) {
		s := replacing()
		pub, ok := published(&s, latest, written{}, false)
		require.True(t, ok)
		assert.Equal(t, v1alpha1.PhaseReplacing, pub.phase)
		assert.True(t, pub.healthy)
		assert.True(t, pub.fields[contract.MemoKey].(contract.ProxyMemo).Healthy)

		s = replacing()
		s.Health.Healthy = false
		pub, _ = published(&s, latest, written{}, false)
		assert.False(t, pub.healthy, "an unhealthy one is not")
	})

	t.Run("runs of version 4 took a replaced instance out at once", func(t *testing.T) {
		s := replacing()
		pub, ok := published(&s, policyFor(versionShardMonitor), written{}, false)
		require.True(t, ok)
		assert.False(t, pub.healthy)
	})

	t.Run("an External proxy whose credentials are unread is not leasable in the memo", func(t *testing.T) {
		spec := externalSpec()
		spec.Endpoint.CredentialsSecretRef = &v1alpha1.SecretRef{Name: "creds"}
		s := ProxyState{UID: "u1", Generation: 1, Spec: spec, Health: activities.Health{Known: true, Healthy: true}}
		pub, ok := published(&s, latest, written{}, false)
		require.True(t, ok)
		memo := pub.fields[contract.MemoKey].(contract.ProxyMemo)
		assert.False(t, memo.Healthy)
		assert.Nil(t, memo.Auth)

		s.Sealed = "sealed-box"
		pub, _ = published(&s, latest, written{}, false)
		memo = pub.fields[contract.MemoKey].(contract.ProxyMemo)
		assert.True(t, memo.Healthy)
		require.NotNil(t, memo.Auth)
		assert.Equal(t, "sealed-box", memo.Auth.Sealed)
	})

	t.Run("cooldowns that ended are left out", func(t *testing.T) {
		s := serving()
		s.Cooldowns = map[string]time.Time{"ended.example": t0.Add(-time.Second), "on.example": t0.Add(time.Minute)}
		pub, _ := published(&s, latest, written{}, false)
		memo := pub.fields[contract.MemoKey].(contract.ProxyMemo)
		assert.Equal(t, map[string]time.Time{"on.example": t0.Add(time.Minute)}, memo.Cooldowns)
	})

	t.Run("the verdict carries its reason only from version 5", func(t *testing.T) {
		s := serving()
		s.Health.FailureReason = v1alpha1.ReasonHealthCheckTargetDown
		pub, _ := published(&s, latest, written{}, false)
		assert.Equal(t, v1alpha1.ReasonHealthCheckTargetDown, pub.fields[activities.VerdictMemoKey].(*activities.Verdict).FailureReason)
		pub, _ = published(&s, policyFor(versionShardMonitor), written{}, false)
		assert.Empty(t, pub.fields[activities.VerdictMemoKey].(*activities.Verdict).FailureReason)
	})
}
