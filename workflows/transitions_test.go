package workflows

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// The tests in this file drive the pure core (transitions.go) transition by transition, without
// Temporal: each case is a state, one event at a time, and what must hold afterwards.

var (
	t0      = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tuning0 = Tuning{}.WithDefaults()
)

func managedSpec(mut ...func(*v1alpha1.ProxySpec)) *v1alpha1.ProxySpec {
	s := &v1alpha1.ProxySpec{Mode: v1alpha1.ModeManaged, Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}}
	for _, m := range mut {
		m(s)
	}
	return s
}

func externalSpec() *v1alpha1.ProxySpec {
	return &v1alpha1.ProxySpec{Mode: v1alpha1.ModeExternal, Endpoint: &v1alpha1.Endpoint{Host: "h", Port: 1}}
}

func runningRef(name string, spec *v1alpha1.ProxySpec) *InstanceRef {
	return &InstanceRef{Name: name, Hash: DesiredHash(spec, ""), Spec: *spec, Created: true,
		State: provider.StateRunning, IP: "127.0.0.1", Port: 3128, CreatedAt: t0.Add(-time.Hour)}
}

// steadyState is a Managed proxy serving from instance "a", healthy.
func steadyState(mut ...func(*v1alpha1.ProxySpec)) ProxyState {
	spec := managedSpec(mut...)
	return ProxyState{UID: "u1", Generation: 1, Spec: spec, Counter: 1, Instance: runningRef("a", spec),
		Health: activities.Health{Known: true, Healthy: true, Since: t0.Add(-time.Hour)}}
}

func names(refs []InstanceRef) []string {
	out := []string{}
	for _, r := range refs {
		out = append(out, r.Name)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// respec applies the next generation of s's spec after mut.
func (s *ProxyState) respec(gen int64, mut func(*v1alpha1.ProxySpec)) {
	spec := *s.Spec
	mut(&spec)
	s.applySpec(SpecSignal{UID: s.UID, Generation: gen, Spec: spec})
}

func TestApplySpec(t *testing.T) {
	spec1 := managedSpec()
	spec2 := managedSpec(func(s *v1alpha1.ProxySpec) { s.Port = 8080 })
	withSecret := managedSpec(func(s *v1alpha1.ProxySpec) {
		s.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "ci", Key: "user-data"}}
	})
	cases := []struct {
		name   string
		state  ProxyState
		sig    SpecSignal
		replan bool
		check  func(*testing.T, ProxyState)
	}{
		{"first spec", ProxyState{}, SpecSignal{UID: "u1", Generation: 1, Spec: *spec1}, true, func(t *testing.T, s ProxyState) {
			assert.Equal(t, "u1", s.UID)
			assert.Equal(t, int64(1), s.Generation)
			assert.Equal(t, stepCreate, plan(&s, t0))
		}},
		{"duplicate is ignored", steadyState(), SpecSignal{UID: "u1", Generation: 1, Spec: *spec2}, false, func(t *testing.T, s ProxyState) {
			assert.Equal(t, int32(0), s.Spec.Port, "the duplicate's spec is not taken")
		}},
		{"older generation is ignored", func() ProxyState { s := steadyState(); s.Generation = 5; return s }(),
			SpecSignal{UID: "u1", Generation: 4, Spec: *spec2}, false, func(t *testing.T, s ProxyState) {
				assert.Equal(t, int64(5), s.Generation)
			}},
		{"newer generation replaces make-before-break", steadyState(), SpecSignal{UID: "u1", Generation: 2, Spec: *spec2}, true, func(t *testing.T, s ProxyState) {
			assert.Equal(t, stepCreateNext, plan(&s, t0))
		}},
		{"a new secret version at the same generation is taken", steadyState(), SpecSignal{UID: "u1", Generation: 1, SecretVersion: "7", Spec: *withSecret}, true, func(t *testing.T, s ProxyState) {
			assert.True(t, s.NeedHash)
			assert.Equal(t, stepHash, plan(&s, t0))
		}},
		{"a newer spec clears backoff, quota and the failure latch", func() ProxyState {
			s := steadyState()
			s.RetryAt, s.Attempt, s.LastError, s.Quota = t0.Add(time.Hour), 4, "boom", "no CPUs"
			s.Failure = &Failure{Generation: 1, Message: "bad zone"}
			return s
		}(), SpecSignal{UID: "u1", Generation: 2, Spec: *spec1}, true, func(t *testing.T, s ProxyState) {
			assert.Nil(t, s.Failure)
			assert.Zero(t, s.Attempt)
			assert.Empty(t, s.LastError+s.Quota)
			assert.True(t, s.RetryAt.IsZero())
		}},
		{"another object's spec retires this one's instances", steadyState(), SpecSignal{UID: "u2", Generation: 1, Spec: *spec1}, true, func(t *testing.T, s ProxyState) {
			assert.Equal(t, "u2", s.UID)
			assert.Equal(t, []string{"a"}, names(s.Retiring))
			assert.Nil(t, s.Instance)
			assert.Equal(t, stepDelete, plan(&s, t0))
		}},
		{"another object's spec while deleting becomes the successor", func() ProxyState {
			s := steadyState()
			s.requestDelete(contract.DeleteSignal{UID: "u1"})
			return s
		}(), SpecSignal{UID: "u2", Generation: 1, Spec: *spec1}, false, func(t *testing.T, s ProxyState) {
			require.NotNil(t, s.Successor)
			assert.Equal(t, "u2", s.Successor.UID)
			assert.Equal(t, "u1", s.UID, "the deletion finishes first")
		}},
		{"this object's spec while deleting changes nothing", func() ProxyState {
			s := steadyState()
			s.requestDelete(contract.DeleteSignal{UID: "u1"})
			return s
		}(), SpecSignal{UID: "u1", Generation: 9, Spec: *spec2}, false, func(t *testing.T, s ProxyState) {
			assert.Nil(t, s.Successor)
			assert.Equal(t, int64(1), s.Generation)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.state
			e := s.applySpec(tc.sig)
			assert.Equal(t, tc.replan, e.replan)
			tc.check(t, s)
		})
	}
}

func TestRequestDeleteAndReplace(t *testing.T) {
	t.Run("delete retires every instance and finishes after", func(t *testing.T) {
		s := steadyState()
		s.Next = &InstanceRef{Name: "b"}
		s.DeleteRetryAt = t0.Add(time.Hour)
		e := s.requestDelete(contract.DeleteSignal{UID: "u1"})
		assert.True(t, e.replan)
		assert.Equal(t, []string{"b", "a"}, names(s.Retiring))
		assert.True(t, s.DeleteRetryAt.IsZero(), "deletion starts now, not after an old backoff")
		assert.Equal(t, stepDelete, plan(&s, t0))
		s.deleted("b")
		s.deleted("a")
		assert.Equal(t, stepFinish, plan(&s, t0))
	})
	t.Run("a second delete changes nothing", func(t *testing.T) {
		s := steadyState()
		s.requestDelete(contract.DeleteSignal{UID: "u1"})
		assert.False(t, s.requestDelete(contract.DeleteSignal{UID: "u1"}).replan)
		assert.Len(t, s.Retiring, 1)
	})
	t.Run("a delete for an older object is ignored", func(t *testing.T) {
		s := steadyState()
		assert.False(t, s.requestDelete(contract.DeleteSignal{UID: "u0"}).replan)
		assert.False(t, s.Deleting)
	})
	t.Run("replace builds a replacement now", func(t *testing.T) {
		s := steadyState()
		s.RetryAt, s.Attempt = t0.Add(time.Hour), 3
		e := s.requestReplace(contract.ReplaceSignal{})
		assert.True(t, e.replan)
		assert.Equal(t, "manual", s.ReplaceReason)
		assert.Equal(t, stepCreateNext, plan(&s, t0))
	})
	for name, s := range map[string]ProxyState{
		"no spec":  {},
		"external": {UID: "u1", Spec: externalSpec()},
		"deleting": {UID: "u1", Spec: managedSpec(), Deleting: true},
	} {
		t.Run("replace ignored: "+name, func(t *testing.T) {
			assert.False(t, s.requestReplace(contract.ReplaceSignal{Reason: "x"}).replan)
			assert.Empty(t, s.ReplaceReason)
		})
	}
}

func TestReport(t *testing.T) {
	banned := func(target string) contract.ReportSignal {
		return contract.ReportSignal{Target: target, Result: contract.ReportBanned}
	}
	t.Run("a cooldown without an end lasts the default", func(t *testing.T) {
		s := steadyState()
		e := s.report(contract.ReportSignal{Target: "shop.example", Result: contract.ReportRateLimited}, t0)
		assert.True(t, e.publish)
		assert.False(t, e.replan)
		assert.Equal(t, t0.Add(DefaultCooldown), s.Cooldowns["shop.example"])
		assert.Empty(t, s.Bans, "a rate limit is not a ban")
	})
	t.Run("a later end extends, an earlier one does not shorten", func(t *testing.T) {
		s := steadyState()
		s.report(contract.ReportSignal{Target: "x", Result: contract.ReportBanned, Until: t0.Add(time.Hour)}, t0)
		s.report(contract.ReportSignal{Target: "x", Result: contract.ReportBanned, Until: t0.Add(time.Minute)}, t0)
		assert.Equal(t, t0.Add(time.Hour), s.Cooldowns["x"])
	})
	t.Run("ok reports and reports before a spec or while deleting change nothing", func(t *testing.T) {
		s := steadyState()
		assert.Equal(t, effect{}, s.report(contract.ReportSignal{Target: "x", Result: contract.ReportOK}, t0))
		empty := ProxyState{}
		assert.Equal(t, effect{}, empty.report(banned("x"), t0))
		s.requestDelete(contract.DeleteSignal{UID: "u1"})
		assert.Equal(t, effect{}, s.report(banned("x"), t0))
		assert.Empty(t, s.Cooldowns)
	})
	t.Run("a target longer than a DNS name is ignored", func(t *testing.T) {
		s := steadyState()
		e := s.report(banned(string(make([]byte, maxTargetLen+1))), t0)
		assert.False(t, e.publish)
		assert.Empty(t, s.Cooldowns)
	})
	t.Run("bans on enough targets within the window replace the instance", func(t *testing.T) {
		s := steadyState(func(p *v1alpha1.ProxySpec) {
			p.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: ptr(int32(2)), BanWindow: ptr(v1alpha1.Duration("5m"))}
		})
		assert.False(t, s.report(banned("a.example"), t0).replan)
		assert.False(t, s.report(banned("b.example"), t0.Add(6*time.Minute)).replan, "the first ban left the window")
		e := s.report(banned("c.example"), t0.Add(7*time.Minute))
		assert.True(t, e.replan)
		assert.Equal(t, "banned on 2 targets within 5m0s", s.ReplaceReason)
		assert.Equal(t, stepCreateNext, plan(&s, t0.Add(7*time.Minute)))
	})
	t.Run("bans never replace an External proxy", func(t *testing.T) {
		s := ProxyState{UID: "u1", Spec: externalSpec()}
		s.Spec.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: ptr(int32(1))}
		assert.False(t, s.report(banned("a"), t0).replan)
		assert.Empty(t, s.ReplaceReason)
	})
	t.Run("a limit above what is kept still replaces", func(t *testing.T) {
		s := steadyState(func(p *v1alpha1.ProxySpec) {
			p.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: ptr(int32(1000))}
		})
		var replaced bool
		for i := range maxBans {
			replaced = s.report(banned(fmt.Sprintf("t%d.example", i)), t0.Add(time.Duration(i)*time.Second)).replan || replaced
		}
		assert.True(t, replaced)
	})
}

// TestCarriedStateIsBounded: whatever crawlers report, what continue-as-new carries stays
// under a fixed size. The worst case is every report on a new target of the longest length.
func TestCarriedStateIsBounded(t *testing.T) {
	const bound = 160 << 10 // bytes
	for _, targetLen := range []int{12, maxTargetLen} {
		t.Run(fmt.Sprintf("targets of %d characters", targetLen), func(t *testing.T) {
			s := steadyState()
			now := t0
			for i := range 100_000 {
				target := fmt.Sprintf("%0*d", targetLen, i)
				s.report(contract.ReportSignal{Target: target, Result: contract.ReportBanned, Until: now.Add(24 * time.Hour)}, now)
				now = now.Add(time.Second)
			}
			b, err := json.Marshal(s)
			require.NoError(t, err)
			assert.LessOrEqual(t, len(b), bound)
			assert.Len(t, s.Cooldowns, maxCooldowns)
			assert.Len(t, s.Bans, maxBans)
			last := fmt.Sprintf("%0*d", targetLen, 99_999)
			assert.Contains(t, s.Cooldowns, last, "the newest cooldown is kept")
			assert.Contains(t, s.Bans, last, "the newest ban is kept")
			t.Logf("carried state after 100,000 targets: %d bytes", len(b))
		})
	}
}

func TestCreateTransitions(t *testing.T) {
	fresh := func() ProxyState { return ProxyState{UID: "u1", Generation: 1, Spec: managedSpec()} }
	t.Run("allocation names and records before the call", func(t *testing.T) {
		s := fresh()
		name := s.ensureInstance(t0)
		assert.Equal(t, InstanceName("u1", 1), name)
		assert.Equal(t, name, s.ensureInstance(t0), "a retried create keeps its name")
		assert.Equal(t, 1, s.Counter)
		assert.False(t, s.Instance.Created)
		assert.Equal(t, t0, s.Instance.CreatedAt)
	})
	t.Run("created records the instance and clears failures", func(t *testing.T) {
		s := fresh()
		name := s.ensureInstance(t0)
		s.Attempt, s.LastError, s.RetryAt = 2, "x", t0
		s.created(name, activities.CreateResult{Instance: provider.Instance{ProviderID: "p/" + name, State: provider.StateProvisioning}})
		assert.True(t, s.Instance.Created)
		assert.Equal(t, "p/"+name, s.Instance.ProviderID)
		assert.Equal(t, int32(3128), s.Instance.Port, "the spec's port until the provider says")
		assert.Empty(t, s.LastError)
		assert.True(t, s.RetryAt.IsZero())
		assert.Equal(t, 2, s.Attempt, "counted until the instance runs")
		assert.Equal(t, stepWaitRunning, plan(&s, t0))
		s.waited(name, activities.WaitResult{Instance: provider.Instance{State: provider.StateRunning, IP: "10.0.0.1"}})
		assert.Zero(t, s.Attempt, "reset once it runs")
	})
	t.Run("instances lost before they ever ran back off longer each time", func(t *testing.T) {
		s := fresh()
		var waits []time.Duration
		now := t0
		for range 4 {
			name := s.ensureInstance(now)
			s.created(name, activities.CreateResult{})
			s.waited(name, activities.WaitResult{Gone: true})
			s.lostWhileProvisioning(name, now, tuning0)
			s.deleted(name)
			waits = append(waits, s.RetryAt.Sub(now))
			now = s.RetryAt
		}
		assert.Equal(t, []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second}, waits)
	})
	t.Run("created after a rotation raced the hash takes the newer data", func(t *testing.T) {
		s := fresh()
		s.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "ci", Key: "k"}}
		s.SecretHash = "old"
		name := s.ensureInstance(t0)
		s.created(name, activities.CreateResult{SecretHash: "new"})
		assert.Equal(t, "new", s.SecretHash)
		assert.Equal(t, DesiredHash(s.Spec, "new"), s.Instance.Hash)
	})
	t.Run("created for a record already retired changes only the record", func(t *testing.T) {
		s := fresh()
		name := s.ensureInstance(t0)
		s.requestDelete(contract.DeleteSignal{UID: "u1"})
		s.created(name, activities.CreateResult{Instance: provider.Instance{ProviderID: "p/x"}})
		assert.Nil(t, s.Instance)
		assert.Equal(t, "p/x", s.Retiring[0].ProviderID, "the delete addresses what was created")
	})
	for _, tc := range []struct {
		kind  failKind
		check func(*testing.T, ProxyState)
	}{
		{failQuota, func(t *testing.T, s ProxyState) {
			assert.Equal(t, "m", s.Quota)
			assert.Equal(t, t0.Add(tuning0.QuotaRetry), s.RetryAt)
			assert.Equal(t, v1alpha1.PhaseProvisioning, phase(&s))
			assert.NotNil(t, s.Instance, "the record stays: the retry uses the same name")
		}},
		{failPermanent, func(t *testing.T, s ProxyState) {
			assert.Equal(t, v1alpha1.PhaseFailed, phase(&s))
			assert.Nil(t, s.Instance)
			assert.Len(t, s.Retiring, 1, "retired anyway, so a delete makes sure")
		}},
		{failCloudInit, func(t *testing.T, s ProxyState) {
			assert.True(t, s.NeedHash)
			assert.Equal(t, "m", s.CloudInitError)
			assert.Equal(t, t0.Add(tuning0.RetryBase), s.RetryAt)
		}},
		{failTransient, func(t *testing.T, s ProxyState) {
			assert.Equal(t, "m", s.LastError)
			assert.Equal(t, t0.Add(tuning0.RetryBase), s.RetryAt)
			assert.Equal(t, stepSteady, plan(&s, t0), "waits out the backoff")
			assert.Equal(t, stepCreate, plan(&s, s.RetryAt))
		}},
	} {
		t.Run(fmt.Sprintf("create failed (kind %d)", tc.kind), func(t *testing.T) {
			s := fresh()
			name := s.ensureInstance(t0)
			s.createFailed(name, tc.kind, "m", t0, tuning0)
			assert.Equal(t, 1, s.Attempt)
			tc.check(t, s)
		})
	}
	t.Run("backoff doubles up to the maximum", func(t *testing.T) {
		tu := Tuning{RetryBase: time.Second, RetryMax: 10 * time.Second}
		var got []time.Duration
		for i := 1; i <= 6; i++ {
			got = append(got, tu.Backoff(i))
		}
		assert.Equal(t, []time.Duration{1e9, 2e9, 4e9, 8e9, 10e9, 10e9}, got)
	})
}

func TestWaitedAndVerified(t *testing.T) {
	provisioning := func() ProxyState {
		s := ProxyState{UID: "u1", Generation: 1, Spec: managedSpec()}
		name := s.ensureInstance(t0)
		s.created(name, activities.CreateResult{Instance: provider.Instance{ProviderID: "p/" + name}})
		return s
	}
	t.Run("running records the address", func(t *testing.T) {
		s := provisioning()
		s.waited(s.Instance.Name, activities.WaitResult{Instance: provider.Instance{State: provider.StateRunning, IP: "10.0.0.1", Port: 9}})
		assert.True(t, s.Instance.Running())
		assert.Equal(t, int32(9), s.Instance.Port)
		assert.Equal(t, stepSteady, plan(&s, t0))
	})
	t.Run("still provisioning waits again", func(t *testing.T) {
		s := provisioning()
		s.waited(s.Instance.Name, activities.WaitResult{Instance: provider.Instance{State: provider.StateProvisioning}})
		assert.Equal(t, stepWaitRunning, plan(&s, t0))
	})
	for _, res := range []activities.WaitResult{{Gone: true}, {Instance: provider.Instance{State: provider.StateStopped}}} {
		t.Run(fmt.Sprintf("gone=%v stopped=%v retires and creates a new name", res.Gone, !res.Gone), func(t *testing.T) {
			s := provisioning()
			e := s.waited(s.Instance.Name, res)
			assert.True(t, e.warn)
			assert.Nil(t, s.Instance)
			assert.Len(t, s.Retiring, 1)
			assert.True(t, e.lost)
			s.lostWhileProvisioning(s.Retiring[0].Name, t0, tuning0)
			s.deleted(s.Retiring[0].Name)
			assert.Equal(t, stepSteady, plan(&s, t0), "the next create waits: no tight loop")
			assert.Contains(t, s.LastError, "before it ever ran")
			assert.Equal(t, InstanceName("u1", 2), s.ensureInstance(t0))
		})
	}

	replacing := func(current bool) ProxyState {
		s := steadyState()
		s.Health.Healthy = current
		s.Spec.Port = 8080
		name := s.ensureNext(t0)
		s.created(name, activities.CreateResult{})
		s.waited(name, activities.WaitResult{Instance: provider.Instance{State: provider.StateRunning, IP: "10.0.0.2"}})
		return s
	}
	t.Run("a healthy replacement is promoted", func(t *testing.T) {
		s := replacing(true)
		require.Equal(t, stepVerifyNext, plan(&s, t0))
		s.verified(s.Next.Name, activities.Health{Known: true, Healthy: true, LatencyMillis: 7}, t0, tuning0)
		require.Equal(t, stepPromote, plan(&s, t0))
	})
	t.Run("an unhealthy replacement of a healthy instance is retired and retried later", func(t *testing.T) {
		s := replacing(true)
		name := s.Next.Name
		s.verified(name, activities.Health{Known: true, LastFailure: "refused"}, t0, tuning0)
		assert.Nil(t, s.Next)
		assert.Equal(t, []string{name}, names(s.Retiring))
		assert.Contains(t, s.LastError, "refused")
		assert.Equal(t, t0.Add(tuning0.RetryBase), s.RetryAt)
	})
	t.Run("an unhealthy replacement of an unhealthy instance is promoted: nothing is lost", func(t *testing.T) {
		s := replacing(false)
		s.verified(s.Next.Name, activities.Health{Known: true}, t0, tuning0)
		assert.Equal(t, stepPromote, plan(&s, t0))
	})
	t.Run("a verdict for a replacement no longer there is dropped", func(t *testing.T) {
		s := replacing(true)
		assert.Equal(t, effect{}, s.verified("someone-else", activities.Health{Known: true}, t0, tuning0))
		assert.Nil(t, s.Next.Health)
	})
	t.Run("promote swaps, retires the old instance and forgets its bans", func(t *testing.T) {
		s := replacing(true)
		s.ReplaceReason = "maxAge"
		s.report(contract.ReportSignal{Target: "x", Result: contract.ReportBanned}, t0)
		s.verified(s.Next.Name, activities.Health{Known: true, Healthy: true, LatencyMillis: 7}, t0, tuning0)
		next := s.Next.Name
		e := s.promote(t0.Add(time.Minute))
		assert.True(t, e.publish)
		assert.Equal(t, next, s.Instance.Name)
		assert.Equal(t, []string{"a"}, names(s.Retiring))
		assert.Equal(t, int32(1), s.Replacements)
		assert.Empty(t, s.Cooldowns)
		assert.Empty(t, s.Bans)
		assert.Empty(t, s.ReplaceReason)
		assert.Equal(t, int64(7), s.Health.LatencyMillis)
		assert.Equal(t, t0.Add(time.Minute), s.Instance.CreatedAt, "maxAge counts from promotion")
		assert.Nil(t, s.Instance.Health)
		assert.Equal(t, stepDelete, plan(&s, t0))
	})
}

func TestDeleteTransitions(t *testing.T) {
	s := steadyState()
	s.requestDelete(contract.DeleteSignal{UID: "u1"})
	s.Attempt = 5 // creates' failures do not set the delete's pace
	s.deleteFailed("api down", t0, tuning0)
	assert.Equal(t, t0.Add(tuning0.Backoff(1)), s.DeleteRetryAt)
	assert.Equal(t, stepSteady, plan(&s, t0), "waits out the delete's backoff")
	assert.Equal(t, stepDelete, plan(&s, s.DeleteRetryAt))
	// Each failure in a row waits longer, up to RetryMax.
	var waits []time.Duration
	for range 12 {
		s.deleteFailed("api down", t0, tuning0)
		waits = append(waits, s.DeleteRetryAt.Sub(t0))
	}
	for i := 1; i < len(waits); i++ {
		assert.GreaterOrEqual(t, waits[i], waits[i-1])
	}
	assert.Greater(t, waits[3], waits[0], "delete retries back off")
	assert.Equal(t, tuning0.RetryMax, waits[len(waits)-1])
	s.deleted("a")
	assert.Zero(t, s.DeleteAttempts, "a delete that succeeds starts the count again")
	assert.Empty(t, s.Retiring)
	assert.True(t, s.DeleteRetryAt.IsZero())
	assert.Equal(t, stepFinish, plan(&s, t0))
}

func TestMonitorTransitions(t *testing.T) {
	verdict := func(healthy bool) activities.MonitorResult {
		return activities.MonitorResult{Reason: activities.MonitorVerdict, Health: activities.Health{Known: true, Healthy: healthy}}
	}
	t.Run("a flipped verdict starts its grace now", func(t *testing.T) {
		s := steadyState()
		s.monitorReturned(verdict(false), t0)
		assert.Equal(t, t0, s.Health.Since)
		assert.Equal(t, v1alpha1.PhaseUnhealthy, phase(&s))
	})
	t.Run("a latency change keeps the verdict's start", func(t *testing.T) {
		s := steadyState()
		since := s.Health.Since
		s.monitorReturned(activities.MonitorResult{Reason: activities.MonitorLatency, Health: activities.Health{Known: true, Healthy: true, LatencyMillis: 90}}, t0)
		assert.Equal(t, since, s.Health.Since)
		assert.Equal(t, int64(90), s.Health.LatencyMillis)
	})
	for _, reason := range []string{activities.MonitorGone, activities.MonitorStopped} {
		t.Run("instance "+reason+" is retired and recreated", func(t *testing.T) {
			s := steadyState()
			e := s.monitorReturned(activities.MonitorResult{Reason: reason, Health: s.Health}, t0)
			assert.True(t, e.warn)
			assert.Nil(t, s.Instance)
			assert.Equal(t, []string{"a"}, names(s.Retiring))
			assert.Equal(t, v1alpha1.PhaseUnhealthy, phase(&s))
			assert.Equal(t, stepDelete, plan(&s, t0))
		})
	}
	t.Run("a lost instance is replaced before it is deleted (versionLostFirst)", func(t *testing.T) {
		s := steadyState()
		s.policy.createFirst = true
		s.monitorReturned(activities.MonitorResult{Reason: activities.MonitorStopped, Health: s.Health,
			Instance: provider.Instance{State: provider.StateStopped, Preempted: true}}, t0)
		require.Len(t, s.Retiring, 1)
		assert.True(t, s.Retiring[0].Lost)
		assert.Equal(t, LostPreempted, s.Retiring[0].LostReason)
		assert.Equal(t, "instance "+LostPreempted, s.Health.LastFailure)
		assert.Equal(t, stepCreate, plan(&s, t0))
		s.RetryAt = t0.Add(time.Minute) // a create that must wait leaves the delete to go first
		assert.Equal(t, stepDelete, plan(&s, t0))
		s.RetryAt = time.Time{}
		s.Instance = s.allocate(t0)
		s.Instance.Created = true
		assert.Equal(t, stepDelete, plan(&s, t0), "created: the lost one is deleted while the new one boots")
	})
	t.Run("a failed monitor keeps the verdict and says why", func(t *testing.T) {
		s := steadyState()
		s.monitorFailed("bad interval")
		assert.True(t, s.Health.Healthy)
		assert.Equal(t, "bad interval", s.Health.LastFailure)
	})
}

func TestNextWakeAndWoke(t *testing.T) {
	cases := []struct {
		name    string
		state   func() ProxyState
		wake    time.Time
		why     string
		replace string
	}{
		{"a healthy proxy without lifecycle never wakes", func() ProxyState { return steadyState() }, time.Time{}, "", ""},
		{"maxAge", func() ProxyState {
			return steadyState(func(p *v1alpha1.ProxySpec) { p.Lifecycle = &v1alpha1.Lifecycle{MaxAge: ptr(v1alpha1.Duration("24h"))} })
		}, t0.Add(23 * time.Hour), wakeMaxAge, "maxAge"},
		{"unhealthy grace", func() ProxyState {
			s := steadyState(func(p *v1alpha1.ProxySpec) {
				p.Lifecycle = &v1alpha1.Lifecycle{UnhealthyReplaceAfter: ptr(v1alpha1.Duration("5m"))}
			})
			s.Health = activities.Health{Known: true, Since: t0}
			return s
		}, t0.Add(5 * time.Minute), wakeUnhealthy, "unhealthy for 5m0s"},
		{"healthy has no unhealthy grace", func() ProxyState {
			return steadyState(func(p *v1alpha1.ProxySpec) {
				p.Lifecycle = &v1alpha1.Lifecycle{UnhealthyReplaceAfter: ptr(v1alpha1.Duration("5m"))}
			})
		}, time.Time{}, "", ""},
		{"the earliest reason wins", func() ProxyState {
			s := steadyState(func(p *v1alpha1.ProxySpec) { p.Lifecycle = &v1alpha1.Lifecycle{MaxAge: ptr(v1alpha1.Duration("24h"))} })
			s.RetryAt = t0.Add(time.Minute)
			return s
		}, t0.Add(time.Minute), wakeRetry, ""},
		{"a failed delete's retry", func() ProxyState {
			s := steadyState()
			s.DeleteRetryAt = t0.Add(time.Minute)
			return s
		}, t0.Add(time.Minute), wakeRetryDelete, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.state()
			wake, why := s.nextWake(t0)
			assert.Equal(t, tc.wake, wake)
			assert.Equal(t, tc.why, why)
			s.woke(why, wake)
			assert.Equal(t, tc.replace, s.ReplaceReason)
		})
	}
	t.Run("a pending replacement keeps its reason", func(t *testing.T) {
		s := steadyState()
		s.ReplaceReason = "manual"
		s.woke(wakeMaxAge, t0)
		assert.Equal(t, "manual", s.ReplaceReason)
	})
}

func TestHashedAndSuccessor(t *testing.T) {
	s := steadyState()
	s.NeedHash, s.CloudInitError = true, "missing"
	s.hashed("h1")
	assert.Equal(t, "h1", s.SecretHash)
	assert.False(t, s.NeedHash)
	assert.Empty(t, s.CloudInitError)

	s.requestDelete(contract.DeleteSignal{UID: "u1"})
	s.applySpec(SpecSignal{UID: "u2", Generation: 1, Spec: *managedSpec()})
	next := s.successor()
	assert.Equal(t, "u2", next.UID)
	assert.Empty(t, next.Retiring)
	assert.Zero(t, next.Counter, "a new object's instances are numbered from its own UID")
	assert.Equal(t, stepCreate, plan(next, t0))
}

func found(instances ...activities.OwnedInstance) activities.FindResult {
	return activities.FindResult{Instances: instances}
}

func owned(name string, st provider.State, hash string) activities.OwnedInstance {
	inst := provider.Instance{Name: name, ProviderID: "p/" + name, State: st, CreatedAt: t0.Add(-24 * time.Hour),
		Labels: map[string]string{provider.LabelProxyUID: "u1"}}
	if st == provider.StateRunning {
		inst.IP = "10.0.0.7"
	}
	if hash != "" {
		inst.Labels[provider.LabelSpecHash] = hash
	}
	return activities.OwnedInstance{Provider: v1alpha1.ProviderLocal, Instance: inst}
}

// TestAdopt: a run that starts without state lists what earlier runs left before anything
// else, adopts the newest instance that can serve and retires the rest.
func TestAdopt(t *testing.T) {
	fresh := func() ProxyState {
		s := ProxyState{Unlisted: true}
		s.applySpec(SpecSignal{UID: "u1", Generation: 3, Spec: *managedSpec()})
		return s
	}
	want := DesiredHash(managedSpec(), "")
	n := func(i int) string { return InstanceName("u1", i) }

	t.Run("listing comes first, also before a deletion finishes", func(t *testing.T) {
		s := fresh()
		assert.Equal(t, stepList, plan(&s, t0))
		d := ProxyState{Unlisted: true}
		d.requestDelete(contract.DeleteSignal{UID: "u1"})
		assert.Equal(t, stepList, plan(&d, t0), "a deletion must not finish before it knows what to delete")
		noUID := ProxyState{Unlisted: true}
		assert.Equal(t, stepIdle, plan(&noUID, t0), "nothing to list for before the first signal")
	})
	t.Run("a failed list is retried after a backoff", func(t *testing.T) {
		s := fresh()
		s.failed(failTransient, "gcp: 503", t0, tuning0)
		assert.Equal(t, stepSteady, plan(&s, t0))
		assert.Equal(t, stepList, plan(&s, s.RetryAt))
	})
	t.Run("the replacement count goes on from the published status", func(t *testing.T) {
		s := fresh()
		s.adopt(activities.FindResult{Replacements: 7}, t0)
		assert.Equal(t, int32(7), s.Replacements)
	})
	t.Run("nothing found but a published instance: new names start past it", func(t *testing.T) {
		// Its instance is gone (a Spot instance EC2 took back, say), but EC2 keeps its
		// name's client token for a while: a new instance under that name would be
		// answered with the terminated one.
		s := fresh()
		s.adopt(activities.FindResult{Published: n(7)}, t0)
		assert.Equal(t, n(8), s.ensureInstance(t0))
		other := fresh()
		other.adopt(activities.FindResult{Published: "px-someone-else-9"}, t0)
		assert.Equal(t, n(1), other.ensureInstance(t0), "a name not of this Proxy's is ignored")
	})
	t.Run("a published number no run could have made is ignored", func(t *testing.T) {
		// A hand-edited status naming px-<hash>-9223372036854775807 would make the next
		// number wrap around to a negative one (review 33b).
		s := fresh()
		s.adopt(activities.FindResult{Published: n(math.MaxInt)}, t0)
		name := s.ensureInstance(t0)
		assert.Positive(t, s.Counter, "the counter wrapped around: %d", s.Counter)
		assert.NotContains(t, name, "--", "a negative instance number: %s", name)
	})
	t.Run("nothing found: create as usual, from 1", func(t *testing.T) {
		s := fresh()
		e := s.adopt(activities.FindResult{}, t0)
		assert.False(t, e.warn)
		assert.Equal(t, stepCreate, plan(&s, t0))
		assert.Equal(t, n(1), s.ensureInstance(t0))
	})
	t.Run("the newest running instance built from this spec is kept as-is", func(t *testing.T) {
		s := fresh()
		e := s.adopt(found(
			owned(n(3), provider.StateRunning, want),
			owned(n(5), provider.StateRunning, want),
			owned(n(6), provider.StateProvisioning, want),
			owned(n(4), provider.StateStopped, want),
		), t0)
		assert.True(t, e.warn)
		require.NotNil(t, s.Instance)
		assert.Equal(t, n(5), s.Instance.Name, "running beats a newer one still provisioning")
		assert.Equal(t, "p/"+n(5), s.Instance.ProviderID)
		assert.Equal(t, t0.Add(-24*time.Hour), s.Instance.CreatedAt, "maxAge counts from the provider's creation")
		assert.ElementsMatch(t, []string{n(3), n(6), n(4)}, names(s.Retiring))
		assert.Equal(t, 6, s.Counter, "new instances get new names")
		assert.Equal(t, stepDelete, plan(&s, t0))
		for _, r := range names(s.Retiring) {
			s.deleted(r)
		}
		assert.Equal(t, stepSteady, plan(&s, t0), "no replacement: it was built from this spec")
	})
	t.Run("an instance from another spec is adopted and replaced make-before-break", func(t *testing.T) {
		s := fresh()
		s.adopt(found(owned(n(2), provider.StateRunning, "0123456789abcdef")), t0)
		require.NotNil(t, s.Instance)
		assert.Equal(t, stepCreateNext, plan(&s, t0), "it serves while its replacement is built")
		assert.Equal(t, n(3), s.ensureNext(t0))
	})
	t.Run("an instance without a spec hash (version 0) is kept as it is", func(t *testing.T) {
		s := fresh()
		s.adopt(found(owned(n(2), provider.StateRunning, "")), t0)
		require.NotNil(t, s.Instance)
		assert.Equal(t, stepSteady, plan(&s, t0), "moving a fleet to this version replaces nothing")
		s.respec(4, func(p *v1alpha1.ProxySpec) { p.Port = 9 })
		assert.Equal(t, stepCreateNext, plan(&s, t0), "a later spec change still replaces it")
	})
	t.Run("with cloud-init, the hash is taken once the Secret is hashed", func(t *testing.T) {
		s := ProxyState{Unlisted: true}
		s.applySpec(SpecSignal{UID: "u1", Generation: 1, Spec: *managedSpec(func(p *v1alpha1.ProxySpec) {
			p.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "ci", Key: "k"}}
		})})
		s.adopt(found(owned(n(1), provider.StateRunning, "")), t0)
		assert.Empty(t, s.Instance.Hash)
		assert.Equal(t, stepHash, plan(&s, t0))
		s.hashed("h1")
		assert.Equal(t, DesiredHash(s.Spec, "h1"), s.Instance.Hash)
		assert.Equal(t, stepSteady, plan(&s, t0))
	})
	t.Run("an instance still provisioning from another spec is retired first", func(t *testing.T) {
		s := fresh()
		s.adopt(found(owned(n(2), provider.StateProvisioning, "old")), t0)
		assert.Equal(t, stepRetireCurrent, plan(&s, t0))
	})
	t.Run("another provider's instance is retired, not adopted", func(t *testing.T) {
		s := fresh()
		o := owned(n(2), provider.StateRunning, want)
		o.Provider = v1alpha1.ProviderGCP
		s.adopt(found(o), t0)
		assert.Nil(t, s.Instance)
		assert.Equal(t, []string{n(2)}, names(s.Retiring))
		assert.Equal(t, v1alpha1.ProviderGCP, s.Retiring[0].Provider, "deleted where it is")
	})
	t.Run("while deleting everything found is retired", func(t *testing.T) {
		s := ProxyState{Unlisted: true}
		s.requestDelete(contract.DeleteSignal{UID: "u1"})
		s.adopt(found(owned(n(1), provider.StateRunning, want), owned(n(2), provider.StateRunning, want)), t0)
		assert.Nil(t, s.Instance)
		assert.Len(t, s.Retiring, 2)
		assert.Equal(t, stepDelete, plan(&s, t0))
	})
	t.Run("an External proxy adopts nothing", func(t *testing.T) {
		s := ProxyState{Unlisted: true}
		s.applySpec(SpecSignal{UID: "u1", Generation: 1, Spec: *externalSpec()})
		s.adopt(found(owned(n(1), provider.StateRunning, "")), t0)
		assert.Nil(t, s.Instance)
		assert.Len(t, s.Retiring, 1)
	})
}

// TestSignalOrderings walks orderings of spec, delete, replace and report through the core
// and checks where each ends.
// TestLegacyRunsKeepTheirOutcomes: decisions added with version 1 keep their version-0
// outcome on a run of version 0, so its recorded history replays.
func TestLegacyRunsKeepTheirOutcomes(t *testing.T) {
	legacy := func() ProxyState { s := steadyState(); s.policy.legacy = true; return s }
	s := legacy()
	assert.True(t, s.report(contract.ReportSignal{Target: string(make([]byte, 300)), Result: contract.ReportBanned}, t0).publish,
		"version 0 took any target")
	s = legacy()
	s.requestDelete(contract.DeleteSignal{UID: "u1"})
	s.requestDelete(contract.DeleteSignal{UID: "u2"})
	s.applySpec(SpecSignal{UID: "u2", Generation: 1, Spec: *managedSpec()})
	assert.NotNil(t, s.Successor, "version 0 provisioned a successor deleted while the old object deleted")
	s = legacy()
	s.Spec.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: ptr(int32(500))}
	assert.Equal(t, 500, s.banLimit())
	s.applySpec(SpecSignal{UID: "other", Generation: 1, Spec: *managedSpec()})
	assert.True(t, s.policy.legacy, "a reset for another object keeps the run's version")
}

func TestSignalOrderings(t *testing.T) {
	specA := SpecSignal{UID: "A", Generation: 1, Spec: *managedSpec()}
	specB := SpecSignal{UID: "B", Generation: 1, Spec: *managedSpec()}
	delA := contract.DeleteSignal{UID: "A"}
	delB := contract.DeleteSignal{UID: "B"}
	replace := contract.ReplaceSignal{Reason: "manual"}
	ban := contract.ReportSignal{Target: "x", Result: contract.ReportBanned}

	type event func(*ProxyState)
	on := func(sig any) event {
		return func(s *ProxyState) {
			switch v := sig.(type) {
			case SpecSignal:
				s.applySpec(v)
			case contract.DeleteSignal:
				s.requestDelete(v)
			case contract.ReplaceSignal:
				s.requestReplace(v)
			case contract.ReportSignal:
				s.report(v, t0)
			}
		}
	}
	serving := func(s *ProxyState) {
		name := s.ensureInstance(t0)
		s.created(name, activities.CreateResult{})
		s.waited(name, activities.WaitResult{Instance: provider.Instance{State: provider.StateRunning, IP: "10.0.0.1"}})
	}
	cases := []struct {
		name          string
		events        []event
		step          step
		successor     string // UID the next run is for, "" for none
		retiring      int
		replaceReason string
	}{
		{"spec then delete", []event{on(specA), serving, on(delA)}, stepDelete, "", 1, ""},
		{"delete before any spec finishes", []event{on(delA)}, stepFinish, "", 0, ""},
		{"delete then a late spec of the same object", []event{on(specA), serving, on(delA), on(specA)}, stepDelete, "", 1, ""},
		{"re-created while deleting: provisioned after", []event{on(specA), serving, on(delA), on(specB)}, stepDelete, "B", 1, ""},
		{"re-created and deleted again while deleting: not provisioned", []event{on(specA), serving, on(delA), on(specB), on(delB)}, stepDelete, "", 1, ""},
		{"its delete before its spec: not provisioned either", []event{on(specA), serving, on(delA), on(delB), on(specB)}, stepDelete, "", 1, ""},
		{"re-created, deleted, re-created again: the last one is", []event{on(specA), serving, on(delA), on(specB), on(delB),
			on(SpecSignal{UID: "C", Generation: 1, Spec: *managedSpec()})}, stepDelete, "C", 1, ""},
		{"replace after delete is ignored", []event{on(specA), serving, on(delA), on(replace)}, stepDelete, "", 1, ""},
		{"report after delete is ignored", []event{on(specA), serving, on(delA), on(ban)}, stepDelete, "", 1, ""},
		{"replace then delete", []event{on(specA), serving, on(replace), on(delA)}, stepDelete, "", 1, "manual"},
		{"replace then a new generation", []event{on(specA), serving, on(replace),
			on(SpecSignal{UID: "A", Generation: 2, Spec: *managedSpec(func(p *v1alpha1.ProxySpec) { p.Port = 9 })})}, stepCreateNext, "", 0, "manual"},
		{"replace before the first instance runs waits for it", []event{on(specA), on(replace)}, stepCreate, "", 0, "manual"},
		{"a delete of an older object is ignored", []event{on(specB), serving, on(delA)}, stepSteady, "", 0, ""},
		{"another object's spec without a delete retires ours", []event{on(specA), serving, on(specB)}, stepDelete, "", 1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := ProxyState{}
			for _, e := range tc.events {
				e(&s)
			}
			assert.Equal(t, tc.step.String(), plan(&s, t0).String())
			if tc.successor == "" {
				assert.Nil(t, s.Successor)
			} else if assert.NotNil(t, s.Successor) {
				assert.Equal(t, tc.successor, s.Successor.UID)
			}
			assert.Len(t, s.Retiring, tc.retiring)
			assert.Equal(t, tc.replaceReason, s.ReplaceReason)
		})
	}
}
