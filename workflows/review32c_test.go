package workflows

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestReview32cUpgradedMemberAsksAfterContinueAsNew: docs/operations.md promises that a
// pool member whose run started on version 5 "replace[s] at once, as before, until [it]
// continue[s] as new (at most 72 hours); from then on [its] own replacements wait for the
// pool's grant". The upgraded operator hands the pool to every run once, at its start
// (the Proxy controller reconciles only on generation changes and deletes, so no other
// spec signal follows): the v5 run that takes that signal drops it (applySpec keeps Pool
// for poolGrants runs only), and the state it carries across continue-as-new has no pool.
// The v6 run then replaces at once, outside the pool's surge budget, until the Proxy's
// spec happens to change or the operator restarts.
func TestReview32cUpgradedMemberAsksAfterContinueAsNew(t *testing.T) {
	banning := func(p *v1alpha1.ProxySpec) {
		p.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: ptr(int32(1))}
	}
	old := steadyState(banning)
	old.policy = policyFor(versionServeWhileReplacing)
	old.Instance.KeyID = "k1"
	// The upgraded operator's reconcile at its start: a duplicate spec naming the pool.
	old.applySpec(SpecSignal{UID: old.UID, Generation: old.Generation, Spec: *old.Spec, Pool: "eu"})

	// Continue-as-new carries ProxyState as JSON (ProxyWorkflowInput.State); the next run
	// takes the latest version.
	b, err := json.Marshal(&old)
	require.NoError(t, err)
	var next ProxyState
	require.NoError(t, json.Unmarshal(b, &next))
	next.policy = policyFor(versionPoolGrants)

	e := next.report(contract.ReportSignal{Target: "shop.example", Result: contract.ReportBanned}, t0)
	assert.False(t, e.replan, "a pool member's v6 run must wait for its pool's grant, not replace at once")
	assert.Empty(t, next.ReplaceReason)
	assert.NotNil(t, next.Asked, "the ban waits for the pool (ReplacementPending)")
}

// TestReview32cBansOfALostInstanceDoNotAskAgain: when the instance is lost, the ask is
// dropped ("whatever a replacement was wanted for, the instance it concerned is gone"),
// but the bans that address earned are kept. The fresh instance, on a new address, then
// asks for a replacement on its first ban, and takes a grant (a surge instance) it has
// not earned.
func TestReview32cBansOfALostInstanceDoNotAskAgain(t *testing.T) {
	s := pooledState(func(p *v1alpha1.ProxySpec) {
		p.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: ptr(int32(3))}
	})
	for _, site := range []string{"a.example", "b.example", "c.example"} {
		s.report(contract.ReportSignal{Target: site, Result: contract.ReportBanned}, t0)
	}
	require.NotNil(t, s.Asked, "banned on 3 sites: it asks")

	s.monitorReturned(activities.MonitorResult{Reason: activities.MonitorGone}, t0)
	require.Nil(t, s.Asked, "the lost instance's ask is dropped")
	// The workflow creates a new instance on a new address.
	s.Instance = runningRef("b", s.Spec)
	s.Instance.KeyID = "k1"
	s.Health = activities.Health{Known: true, Healthy: true, Since: t0}

	s.report(contract.ReportSignal{Target: "d.example", Result: contract.ReportBanned}, t0)
	assert.Nil(t, s.Asked, "one ban on the new address is not banReplaceTargets (3) bans")
}

// TestReview32cSuccessorKeepsItsPool: a Proxy that takes the name of one still being
// deleted (a pool re-creating member eu-3 the moment the old eu-3 is gone, while its run
// finishes) is started from s.successor(), which applies the kept spec signal to a
// ProxyState with a zero policy: applySpec then drops the signal's Pool (poolGrants is
// false), and the new run, of version 6, replaces at once on bans, ill health and maxAge,
// outside its pool's surge budget. No other spec signal follows (the Proxy controller
// signals on generation changes only).
func TestReview32cSuccessorKeepsItsPool(t *testing.T) {
	banning := func(p *v1alpha1.ProxySpec) {
		p.Lifecycle = &v1alpha1.Lifecycle{BanReplaceTargets: ptr(int32(1))}
	}
	old := pooledState(banning)
	old.Deleting = true
	old.applySpec(SpecSignal{UID: "u2", Generation: 1, Spec: *managedSpec(banning), Pool: "eu"})
	require.NotNil(t, old.Successor, "the new object's spec is kept for after the deletion")

	next := old.successor()
	next.policy = policyFor(versionPoolGrants) // what the continued run sets at its start
	assert.Equal(t, "eu", next.Pool, "the new member's run must know its pool")
}
