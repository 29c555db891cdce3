package workflows

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// pooledState is a steady pool member of a run that takes its pool's grants.
func pooledState(mut ...func(*v1alpha1.ProxySpec)) ProxyState {
	s := steadyState(mut...)
	s.policy = policyFor(versionPoolGrants)
	s.Pool = "eu"
	s.Instance.KeyID = "k1" // built with credentials: nothing else calls for a replacement
	return s
}

func pendingCondition(t *testing.T, s *ProxyState) (string, string) {
	t.Helper()
	c := meta.FindStatusCondition(status(s, "wf").Conditions, v1alpha1.ConditionReplacementPending)
	require.NotNil(t, c, "a pool member's status says whether a replacement waits")
	return string(c.Status), c.Reason
}

// TestPoolMemberAsksBeforeReplacing: a pool member's own replacements (bans, maxAge, the
// unhealthy grace) wait for its pool's grant, shown as ReplacementPending; the grant
// starts it; a grant with nothing waiting, or a second one, replaces nothing; runs of
// older versions, and Proxies of no pool, replace at once as before.
func TestPoolMemberAsksBeforeReplacing(t *testing.T) {
	banning := func(p *v1alpha1.ProxySpec) {
		p.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: ptr(int32(1))}
	}
	ban := contract.ReportSignal{Target: "shop.example", Result: contract.ReportBanned}

	t.Run("a ban waits for the grant, which starts it once", func(t *testing.T) {
		s := pooledState(banning)
		st, reason := pendingCondition(t, &s)
		assert.Equal(t, "False", st)
		assert.Equal(t, v1alpha1.ReasonNoneWanted, reason)

		e := s.report(ban, t0)
		assert.False(t, e.replan)
		assert.True(t, e.publish, "the status says it waits")
		assert.Empty(t, s.ReplaceReason)
		require.NotNil(t, s.Asked)
		assert.Equal(t, stepSteady, plan(&s, t0))
		assert.Equal(t, v1alpha1.PhaseReady, phase(&s), "it serves while it waits")
		st, reason = pendingCondition(t, &s)
		assert.Equal(t, "True", st)
		assert.Equal(t, v1alpha1.ReasonBanned, reason)

		e = s.requestReplace(contract.ReplaceSignal{Grant: true})
		assert.True(t, e.replan)
		assert.Nil(t, s.Asked)
		assert.Equal(t, "banned on 1 targets within 1h0m0s (granted by pool eu)", s.ReplaceReason)
		assert.Equal(t, stepCreateNext, plan(&s, t0))
		st, _ = pendingCondition(t, &s)
		assert.Equal(t, "False", st)

		e = s.requestReplace(contract.ReplaceSignal{Grant: true})
		assert.False(t, e.replan, "a second grant is ignored")
	})
	t.Run("maxAge waits, and stops waking the run", func(t *testing.T) {
		s := pooledState(func(p *v1alpha1.ProxySpec) {
			p.Lifecycle = &v1alpha1.Lifecycle{MaxAge: ptr(v1alpha1.Duration("1h"))}
		})
		wake, why := s.nextWake(t0)
		require.Equal(t, wakeMaxAge, why)
		s.woke(why, wake)
		assert.Empty(t, s.ReplaceReason)
		require.NotNil(t, s.Asked)
		assert.Equal(t, v1alpha1.ReasonMaxAge, s.Asked.Cause)
		wake, _ = s.nextWake(t0)
		assert.True(t, wake.IsZero(), "a run that waits for its pool is woken by the grant, not by a timer already past")
	})
	t.Run("the unhealthy grace waits, and is withdrawn when the proxy heals", func(t *testing.T) {
		s := pooledState(func(p *v1alpha1.ProxySpec) {
			p.Lifecycle = &v1alpha1.Lifecycle{UnhealthyReplaceAfter: ptr(v1alpha1.Duration("5m"))}
		})
		s.Health = activities.Health{Known: true, Healthy: false, Since: t0}
		wake, why := s.nextWake(t0)
		require.Equal(t, wakeUnhealthy, why)
		s.woke(why, wake)
		require.NotNil(t, s.Asked)
		assert.Equal(t, v1alpha1.ReasonUnhealthyGrace, s.Asked.Cause)
		s.monitorReturned(activities.MonitorResult{Reason: activities.MonitorVerdict, Health: activities.Health{Known: true, Healthy: true}}, wake)
		assert.Nil(t, s.Asked, "healthy again: no replacement is wanted")
		assert.False(t, s.requestReplace(contract.ReplaceSignal{Grant: true}).replan, "a grant that arrives now replaces nothing")
	})
	t.Run("a promoted replacement serves what waited", func(t *testing.T) {
		s := pooledState(banning)
		s.report(ban, t0)
		s.Next = runningRef("b", s.Spec)
		s.Next.Health = &activities.Health{Known: true, Healthy: true}
		s.promote(t0)
		assert.Nil(t, s.Asked)
	})
	t.Run("a manual replace is not held", func(t *testing.T) {
		s := pooledState(banning)
		s.report(ban, t0)
		assert.True(t, s.requestReplace(contract.ReplaceSignal{Reason: "manual"}).replan)
		assert.Equal(t, "manual", s.ReplaceReason)
		assert.Nil(t, s.Asked)
	})
	t.Run("a Proxy that leaves its pool replaces what waited at once", func(t *testing.T) {
		s := pooledState(banning)
		s.report(ban, t0)
		e := s.applySpec(SpecSignal{UID: s.UID, Generation: s.Generation, Spec: *s.Spec})
		assert.True(t, e.replan)
		assert.Equal(t, "banned on 1 targets within 1h0m0s", s.ReplaceReason)
		assert.Nil(t, s.Asked)
	})
	t.Run("membership arrives with a duplicate spec", func(t *testing.T) {
		s := steadyState(banning)
		s.policy = policyFor(versionPoolGrants)
		s.Instance.KeyID = "k1"
		s.applySpec(SpecSignal{UID: s.UID, Generation: s.Generation, Spec: *s.Spec, Pool: "eu"})
		assert.Equal(t, "eu", s.Pool)
		assert.False(t, s.report(ban, t0).replan)
		assert.NotNil(t, s.Asked)
	})
	t.Run("runs of version 5 and Proxies of no pool replace at once", func(t *testing.T) {
		old := steadyState(banning)
		old.policy = policyFor(versionServeWhileReplacing)
		old.Pool = "eu"
		assert.True(t, old.report(ban, t0).replan)
		assert.Nil(t, old.Asked)
		assert.Nil(t, meta.FindStatusCondition(status(&old, "wf").Conditions, v1alpha1.ConditionReplacementPending))

		alone := steadyState(banning)
		alone.policy = policyFor(versionPoolGrants)
		assert.True(t, alone.report(ban, t0).replan)
		assert.Nil(t, meta.FindStatusCondition(status(&alone, "wf").Conditions, v1alpha1.ConditionReplacementPending))
	})
}

// TestAskEndsWithItsCause: an edit of the lifecycle that asked drops the ask (a maxAge
// or unhealthy timer asks again if still due), and bans still over the limit keep it.
func TestAskEndsWithItsCause(t *testing.T) {
	ban := contract.ReportSignal{Target: "shop.example", Result: contract.ReportBanned}
	s := pooledState(func(p *v1alpha1.ProxySpec) {
		p.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: ptr(int32(1))}
	})
	s.report(ban, t0)
	require.NotNil(t, s.Asked)
	respec := func(gen int64, mut func(*v1alpha1.ProxySpec)) {
		spec := *s.Spec
		mut(&spec)
		s.applySpec(SpecSignal{UID: s.UID, Generation: gen, Spec: spec, Pool: s.Pool})
	}
	respec(2, func(p *v1alpha1.ProxySpec) { p.Attributes = map[string]v1alpha1.AttributeValue{"tier": "b"} })
	assert.NotNil(t, s.Asked, "still banned on as many sites as the limit")
	respec(3, func(p *v1alpha1.ProxySpec) { p.Lifecycle = nil })
	assert.Nil(t, s.Asked, "no ban limit any more: nothing to replace for")
	assert.Empty(t, s.ReplaceReason)
}

// TestPoolMemberAsksBeforeARotation: a rotation of the cloud-init Secret reaches every
// member at once; a pool member's run asks (CloudInitRotated) and keeps serving, not
// Replacing, until its pool grants; the ask goes when the Secret is rotated back or a
// spec change replaces the instance anyway; a lone Proxy replaces at once as before.
func TestPoolMemberAsksBeforeARotation(t *testing.T) {
	booted := func(p *v1alpha1.ProxySpec) {
		p.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "boot", Key: "startup-script"}}
	}
	member := func() ProxyState {
		s := pooledState(booted)
		s.SecretVersion, s.SecretHash = "100", "h1"
		s.Instance.Hash = DesiredHash(s.Spec, "h1")
		return s
	}
	rotate := func(s *ProxyState, version, hash string) {
		s.applySpec(SpecSignal{UID: s.UID, Generation: s.Generation, SecretVersion: version, Spec: *s.Spec, Pool: s.Pool})
		require.Equal(t, stepHash, plan(s, t0))
		s.hashed(hash)
		s.askRotation(t0)
	}

	t.Run("asks, serves, and replaces once granted", func(t *testing.T) {
		s := member()
		s.askRotation(t0)
		require.Nil(t, s.Asked, "nothing rotated yet")
		rotate(&s, "101", "h2")
		require.NotNil(t, s.Asked)
		assert.Equal(t, v1alpha1.ReasonCloudInit, s.Asked.Cause)
		assert.Equal(t, stepSteady, plan(&s, t0))
		assert.Equal(t, v1alpha1.PhaseReady, phase(&s), "it serves, and is not counted as replacing")
		st, reason := pendingCondition(t, &s)
		assert.Equal(t, "True", st)
		assert.Equal(t, v1alpha1.ReasonCloudInit, reason)

		require.True(t, s.requestReplace(contract.ReplaceSignal{Grant: true}).replan)
		s.askRotation(t0)
		assert.Nil(t, s.Asked)
		assert.Equal(t, stepCreateNext, plan(&s, t0))
		assert.Equal(t, v1alpha1.PhaseReplacing, phase(&s))
	})
	t.Run("rotated back: no longer asks", func(t *testing.T) {
		s := member()
		rotate(&s, "101", "h2")
		require.NotNil(t, s.Asked)
		rotate(&s, "102", "h1")
		assert.Nil(t, s.Asked)
		assert.Equal(t, stepSteady, plan(&s, t0))
	})
	t.Run("a spec change replaces it anyway: the ask goes", func(t *testing.T) {
		s := member()
		rotate(&s, "101", "h2")
		require.NotNil(t, s.Asked)
		spec := *s.Spec
		spec.Port = 8080
		s.applySpec(SpecSignal{UID: s.UID, Generation: s.Generation + 1, SecretVersion: "101", Spec: spec, Pool: s.Pool})
		s.hashed("h2")
		s.askRotation(t0)
		assert.Nil(t, s.Asked)
		assert.Equal(t, stepCreateNext, plan(&s, t0), "a template change the pool gave it, within its budget")
	})
	t.Run("a lone Proxy replaces at once", func(t *testing.T) {
		s := member()
		s.Pool = ""
		rotate(&s, "101", "h2")
		assert.Nil(t, s.Asked)
		assert.Equal(t, stepCreateNext, plan(&s, t0))
	})
}

// TestRotationAskKeepsItsPlace: another write to the Secret (a label, or a second
// rotation) keeps a member's ask, and its time, while the Secret is read again.
func TestRotationAskKeepsItsPlace(t *testing.T) {
	s := pooledState(func(p *v1alpha1.ProxySpec) {
		p.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "boot", Key: "startup-script"}}
	})
	s.SecretVersion, s.SecretHash = "100", "h1"
	s.Instance.Hash = DesiredHash(s.Spec, "h1")
	write := func(version, hash string, at time.Time) {
		asked := s.Asked != nil
		s.applySpec(SpecSignal{UID: s.UID, Generation: s.Generation, SecretVersion: version, Spec: *s.Spec, Pool: s.Pool})
		s.askRotation(at)
		require.Equal(t, asked, s.Asked != nil, "an ask stands while the Secret is read again")
		s.hashed(hash)
		s.askRotation(at)
	}
	write("101", "h2", t0)
	require.NotNil(t, s.Asked)
	write("102", "h2", t0.Add(time.Hour)) // a label added
	require.NotNil(t, s.Asked)
	assert.Equal(t, t0, s.Asked.Since, "the ask keeps its place in the pool's queue")
}
