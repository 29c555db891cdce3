package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// review32cSurgeAfter is how many of the pool's members have (or are about to have) a second
// instance once plan p is carried out and every workflow has taken what it was sent: the
// replacing, the granted, the updated, and those just granted.
func review32cSurgeAfter(members []member, p poolPlan, updatedEarlier ...string) int {
	busy := map[string]bool{}
	for _, m := range members {
		if m.replacing || m.granted {
			busy[m.name] = true
		}
	}
	for _, names := range [][]string{p.grant, p.update, updatedEarlier} {
		for _, n := range names {
			busy[n] = true
		}
	}
	return len(busy)
}

// TestReview32cUpdatedMemberWithStaleAskIsInFlight: the pool gives an outdated member
// that asks (banned) the new template; its workflow will replace it for the spec change
// (a surge instance). Until the run has taken the new generation, the member's status is
// the old one: ReplacementPending=True, phase Ready. planPool tests "!current || pending"
// before "!settled", so the member just updated counts as due, not as the rollout step
// it is, and the budget it holds is handed to the next member that asks: with maxSurge 1,
// two members replace at once.
func TestReview32cUpdatedMemberWithStaleAskIsInFlight(t *testing.T) {
	now := poolT0.Add(time.Hour)
	var members []member
	for i := range 4 {
		members = append(members, readyMember(i))
	}
	members[0].current, members[0].pending = false, true // outdated, and banned
	p := planPool(poolInput{desired: 4, surge: 1, unavailable: 1, members: members, now: now})
	require.Equal(t, []string{"eu-0"}, p.update, "step 1: eu-0 takes the new template")

	// The next reconcile: eu-0 carries the new template's label and a new generation its
	// run has not taken yet (its status still says what it said). Meanwhile eu-2 fell ill
	// and its unhealthy grace ran out: it asks too.
	members[0].current, members[0].settled = true, false
	members[2].pending, members[2].ready, members[2].unhealthy = true, false, true
	p = planPool(poolInput{desired: 4, surge: 1, unavailable: 1, members: members, now: now})
	assert.Empty(t, p.grant, "eu-0's spec change is a surge instance in flight: nothing more may start")
	assert.LessOrEqual(t, review32cSurgeAfter(members, p, "eu-0"), 1, "at most maxSurge (1) members replacing at once")
}

// review32cProxy is a pool member as the API server holds it: Ready and Healthy, asking
// (ReplacementPending=True) since askedAt when askedAt is not zero.
func review32cProxy(pool *v1alpha1.ProxyPool, hash string, n int, askedAt time.Time) *v1alpha1.Proxy {
	p := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: memberName(pool.Name, n),
		Labels: map[string]string{v1alpha1.LabelPool: pool.Name, LabelPoolTemplate: hash}}}
	p.Spec = *pool.Spec.Template.Spec.DeepCopy()
	p.CreationTimestamp = metav1.NewTime(poolT0.Add(time.Duration(n) * time.Minute))
	p.Status.Phase = v1alpha1.PhaseReady
	p.Status.Conditions = []metav1.Condition{
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReady},
		{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded},
	}
	pending := metav1.Condition{Type: v1alpha1.ConditionReplacementPending, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNoneWanted}
	if !askedAt.IsZero() {
		pending = metav1.Condition{Type: v1alpha1.ConditionReplacementPending, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonMaxAge, LastTransitionTime: metav1.NewTime(askedAt)}
	}
	p.Status.Conditions = append(p.Status.Conditions, pending)
	return p
}

func review32cPool() *v1alpha1.ProxyPool {
	return &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "eu"},
		Spec: v1alpha1.ProxyPoolSpec{Template: v1alpha1.ProxyTemplate{Spec: v1alpha1.ProxySpec{
			Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}}}}}
}

// TestReview32cLongestAskIsGrantedFirst: among members equally useful, the grant goes to
// the oldest Proxy object (lessUseful ends with the creation time), never to the one that
// has waited longest. A site that bans eu-0's every new address makes eu-0 ask again
// minutes after each replacement, and as the oldest member it wins every free slot: eu-3,
// whose maxAge came due hours ago, waits for as long as the site keeps banning.
func TestReview32cLongestAskIsGrantedFirst(t *testing.T) {
	now := poolT0.Add(24 * time.Hour)
	pool := review32cPool()
	hash := "h1"
	proxies := []*v1alpha1.Proxy{
		review32cProxy(pool, hash, 0, now.Add(-time.Minute)), // banned again, a minute ago
		review32cProxy(pool, hash, 1, time.Time{}),
		review32cProxy(pool, hash, 2, time.Time{}),
		review32cProxy(pool, hash, 3, now.Add(-6*time.Hour)), // maxAge, due six hours ago
	}
	var in = poolInput{desired: 4, surge: 1, unavailable: 1, now: now}
	for _, p := range proxies {
		in.members = append(in.members, memberOf(pool, p, hash))
	}
	p := planPool(in)
	assert.Equal(t, []string{"eu-3"}, p.grant, "the ask that has waited six hours goes before one a minute old")
}

// TestReview32cUnreadyBystanderDoesNotHoldTheSurge: a member that is not Ready and asks
// nothing (its instance fails its health checks and the template has no
// unhealthyReplaceAfter; or its first instance waits for quota) has one instance or none,
// yet planPool counts it as a rollout step in flight for as long as it stays so. With
// maxSurge 1 (25% of 4) one such member stops every ban and maxAge replacement in the pool
// for good.
func TestReview32cUnreadyBystanderDoesNotHoldTheSurge(t *testing.T) {
	now := poolT0.Add(time.Hour)
	var members []member
	for i := range 4 {
		members = append(members, readyMember(i))
	}
	members[1].ready, members[1].unhealthy = false, true // ill for days, asks nothing
	members[3].pending = true                            // banned everywhere
	p := planPool(poolInput{desired: 4, surge: 1, unavailable: 1, members: members, now: now})
	assert.Equal(t, []string{"eu-3"}, p.grant, "no member has a second instance: the surge is free")
}

// TestReview32cFutureGrantIsSentAgain: a grant annotation with a time ahead of the
// operator's clock (written by hand, or by a leader whose clock ran ahead) is counted
// against maxSurge and never sent again (now − grantedAt stays negative): the member
// waits, and holds the slot, until the clock catches up — for a hand-written
// "2099-01-01T00:00:00Z", for ever.
func TestReview32cFutureGrantIsSentAgain(t *testing.T) {
	now := poolT0.Add(time.Hour)
	pool := review32cPool()
	hash := "h1"
	proxies := []*v1alpha1.Proxy{
		review32cProxy(pool, hash, 0, now.Add(-time.Hour)),
		review32cProxy(pool, hash, 1, now.Add(-time.Hour)),
	}
	proxies[0].Annotations = map[string]string{AnnotationReplaceGranted: "2099-01-01T00:00:00Z"}
	var in = poolInput{desired: 2, surge: 1, unavailable: 0, now: now}
	for _, p := range proxies {
		in.members = append(in.members, memberOf(pool, p, hash))
	}
	for _, later := range []time.Duration{0, time.Hour, 30 * 24 * time.Hour} {
		in.now = now.Add(later)
		p := planPool(in)
		assert.True(t, len(p.regrant)+len(p.grant) > 0,
			"%s later: a grant that was never answered is sent (again); got grant %v regrant %v", later, p.grant, p.regrant)
	}
}
