package controller

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

var poolT0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// ready is a member built from the current template, Ready, created n minutes after poolT0.
func readyMember(n int) member {
	return member{name: memberName("eu", n), index: n, created: poolT0.Add(time.Duration(n) * time.Minute),
		current: true, settled: true, ready: true}
}

func outdatedMember(n int) member {
	m := readyMember(n)
	m.current = false
	return m
}

func TestPlanPoolCounts(t *testing.T) {
	t.Run("an empty pool creates the lowest names", func(t *testing.T) {
		p := planPool(poolInput{desired: 3})
		assert.Equal(t, []int{0, 1, 2}, p.create)
	})
	t.Run("names still held by deleting Proxies are skipped", func(t *testing.T) {
		gone := readyMember(1)
		gone.deleting = true
		p := planPool(poolInput{desired: 3, members: []member{readyMember(0), gone}})
		assert.Equal(t, []int{2, 3}, p.create)
	})
	t.Run("at its count nothing happens", func(t *testing.T) {
		p := planPool(poolInput{desired: 2, surge: 1, members: []member{readyMember(0), readyMember(1)}})
		assert.Equal(t, poolPlan{}, p)
	})
	t.Run("scale to zero removes all", func(t *testing.T) {
		p := planPool(poolInput{desired: 0, members: []member{readyMember(0), readyMember(1)}})
		assert.ElementsMatch(t, []string{"eu-0", "eu-1"}, p.remove)
	})
	t.Run("scale-down removes the least useful first: not ready, unhealthy, oldest", func(t *testing.T) {
		notReady := readyMember(5)
		notReady.ready = false
		unhealthy := readyMember(6)
		unhealthy.ready, unhealthy.unhealthy = false, true
		old := readyMember(0)
		young := readyMember(9)
		members := []member{young, old, notReady, unhealthy}
		assert.Equal(t, []string{"eu-6"}, planPool(poolInput{desired: 3, members: members}).remove,
			"not ready and unhealthy goes before not ready alone")
		assert.Equal(t, []string{"eu-6", "eu-5"}, planPool(poolInput{desired: 2, members: members}).remove)
		assert.Equal(t, []string{"eu-6", "eu-5", "eu-0"}, planPool(poolInput{desired: 1, members: members}).remove,
			"then the oldest")
	})
	t.Run("of the Ready ones, those resting for the most sites go first, then those with the fewest leases", func(t *testing.T) {
		busy := readyMember(0)
		busy.leases = 4
		idle := readyMember(1)
		banned := readyMember(2)
		banned.leases, banned.resting = 4, 3
		bannedOnce := readyMember(3)
		bannedOnce.leases, bannedOnce.resting = 1, 1
		lightly := readyMember(4)
		lightly.leases = 1
		notReady := readyMember(5)
		notReady.ready, notReady.leases = false, 4
		members := []member{busy, idle, banned, bannedOnce, lightly, notReady}
		assert.Equal(t, []string{"eu-5", "eu-2", "eu-3", "eu-1", "eu-4"}, planPool(poolInput{desired: 1, members: members}).remove,
			"not ready first whatever it holds; then resting for 3 sites, for 1; then 0 leases, 1 lease; the busiest stays")
	})
	t.Run("a scale-down waits for nothing and rolls nothing", func(t *testing.T) {
		p := planPool(poolInput{desired: 1, surge: 5, members: []member{outdatedMember(0), outdatedMember(1)}})
		assert.Equal(t, []string{"eu-0"}, p.remove)
		assert.Empty(t, p.update)
	})
}

func TestPlanPoolRollout(t *testing.T) {
	ten := func(mut func(i int, m *member)) []member {
		var ms []member
		for i := range 10 {
			m := outdatedMember(i)
			if mut != nil {
				mut(i, &m)
			}
			ms = append(ms, m)
		}
		return ms
	}
	t.Run("make-before-break: at most maxSurge updated at once", func(t *testing.T) {
		p := planPool(poolInput{desired: 10, surge: 2, members: ten(nil)})
		assert.Equal(t, []string{"eu-0", "eu-1"}, p.update)
		assert.Empty(t, p.replace)
	})
	t.Run("updated ones not yet Ready use the budget", func(t *testing.T) {
		members := ten(func(i int, m *member) {
			if i < 2 {
				m.current, m.settled, m.ready = true, false, false
			}
		})
		assert.Empty(t, planPool(poolInput{desired: 10, surge: 2, members: members}).update)
		members[0].settled = true
		assert.Empty(t, planPool(poolInput{desired: 10, surge: 2, members: members}).update, "settled, not Ready")
		members[0].ready, members[0].replacing = true, true
		assert.Empty(t, planPool(poolInput{desired: 10, surge: 2, members: members}).update, "Ready, its replacement not promoted yet")
		members[0].replacing = false
		assert.Equal(t, []string{"eu-2"}, planPool(poolInput{desired: 10, surge: 2, members: members}).update)
	})
	t.Run("replacements driven by anything else use the budget too", func(t *testing.T) {
		members := ten(func(i int, m *member) {
			m.current = true
			if i < 2 {
				m.replacing = true
			}
		})
		members[9].current = false
		assert.Empty(t, planPool(poolInput{desired: 10, surge: 2, members: members}).update)
	})
	t.Run("the ones not Ready are updated first", func(t *testing.T) {
		members := ten(func(i int, m *member) { m.ready = i != 7 })
		assert.Equal(t, []string{"eu-7"}, planPool(poolInput{desired: 10, surge: 1, members: members}).update)
	})
	t.Run("delete-first within maxUnavailable when maxSurge is 0", func(t *testing.T) {
		p := planPool(poolInput{desired: 10, unavailable: 3, members: ten(nil)})
		assert.Equal(t, []string{"eu-0", "eu-1", "eu-2"}, p.replace)
		assert.Empty(t, p.update)
	})
	t.Run("delete-first counts those not back yet", func(t *testing.T) {
		members := ten(func(i int, m *member) {
			if i == 0 {
				m.deleting, m.ready = true, false
			}
		})
		back := readyMember(10)
		back.ready, back.settled = false, false
		members = append(members, back)
		p := planPool(poolInput{desired: 10, unavailable: 2, members: members})
		assert.Equal(t, []string{"eu-1"}, p.replace, "one of two is still down")
		assert.Empty(t, p.create, "ten are active")
		members[10].ready, members[10].settled = true, true
		p = planPool(poolInput{desired: 10, unavailable: 2, members: members})
		assert.Equal(t, []string{"eu-1", "eu-2"}, p.replace, "one being deleted is gone already")
	})
	t.Run("an outdated one that is not Ready may always go", func(t *testing.T) {
		members := ten(func(i int, m *member) { m.ready = i != 4 })
		assert.Equal(t, []string{"eu-4"}, planPool(poolInput{desired: 10, unavailable: 0, members: members}).replace)
	})
}

func TestMemberNames(t *testing.T) {
	assert.Equal(t, "eu-12", memberName("eu", 12))
	assert.Equal(t, 12, memberIndex("eu", "eu-12"))
	for _, name := range []string{"eu", "eu-", "eu-x", "eu-012", "eu-1-2", "us-1", "eu--1"} {
		assert.Equal(t, -1, memberIndex("eu", name), name)
	}
	assert.Equal(t, 3, memberIndex("eu-west", "eu-west-3"))
}

func TestBudget(t *testing.T) {
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	num := func(n int) *intstr.IntOrString { v := intstr.FromInt32(int32(n)); return &v }
	cases := []struct {
		v       *intstr.IntOrString
		desired int
		up      bool
		want    int
	}{
		{nil, 10, true, 3}, {nil, 10, false, 2}, // a Deployment's 25%: surge rounds up, unavailable down
		{nil, 1, true, 1}, {nil, 1, false, 0},
		{pct("50%"), 5, true, 3}, {pct("50%"), 5, false, 2},
		{pct("0%"), 10, true, 0}, {num(4), 10, true, 4}, {num(0), 10, false, 0},
	}
	for _, tc := range cases {
		got, err := budget(tc.v, tc.desired, tc.up)
		require.NoError(t, err)
		assert.Equal(t, tc.want, got, "%v of %d (up %v)", tc.v, tc.desired, tc.up)
	}
	_, err := budget(pct("lots"), 10, true)
	assert.Error(t, err)
}

// TestPlanPoolAtItsLargest: a pool at its largest (20,000) plans its Proxies' names once
// each, skipping the ones taken, shrinks to zero naming every one, and grants no more
// than maxSurge when every member asks.
func TestPlanPoolAtItsLargest(t *testing.T) {
	const n = v1alpha1.MaxPoolReplicas
	var members []member
	for i := 0; i < n; i += 2 {
		members = append(members, readyMember(i))
	}
	p := planPool(poolInput{desired: n, surge: 1, members: members})
	require.Len(t, p.create, n/2)
	seen := map[int]bool{}
	for _, m := range members {
		seen[m.index] = true
	}
	for _, i := range p.create {
		require.False(t, seen[i], "name %d given twice", i)
		seen[i] = true
	}
	p = planPool(poolInput{desired: 0, members: members})
	assert.Len(t, p.remove, n/2)

	// Every member of a full pool asks at once (a site banned them all): a quarter go.
	members = members[:0]
	for i := range n {
		m := readyMember(i)
		m.pending, m.askedAt = true, poolT0
		members = append(members, m)
	}
	surge, err := budget(nil, n, true)
	require.NoError(t, err)
	p = planPool(poolInput{desired: n, surge: surge, members: members, now: poolT0})
	assert.Len(t, p.grant, n/4)
	assert.Empty(t, p.update)
}

// TestStaggeredMaxAge: a pool's Proxies get maxAges apart from each other, within the last
// fifth of the template's, whole seconds, never above the template's nor under the API's
// minimum; and growing the pool changes none of the ages already given.
func TestStaggeredMaxAge(t *testing.T) {
	day := 24 * time.Hour
	var ages []time.Duration
	for n := range 200 {
		a := staggeredMaxAge(day, n)
		assert.LessOrEqual(t, a, day)
		assert.GreaterOrEqual(t, a, day*8/10)
		assert.Zero(t, a%time.Second)
		ages = append(ages, a)
	}
	assert.Equal(t, day, ages[0], "the first keeps the template's age")
	// Of any ten consecutive members, no two come due within a minute of each other.
	for start := 0; start+10 <= len(ages); start++ {
		w := slices.Clone(ages[start : start+10])
		slices.Sort(w)
		for i := 1; i < len(w); i++ {
			require.Greater(t, w[i]-w[i-1], time.Minute, "members %d..%d", start, start+9)
		}
	}
	assert.Equal(t, minMaxAge, staggeredMaxAge(11*time.Minute, 1), "never under the API's minimum")
	assert.Equal(t, day, staggeredMaxAge(day, -1), "a name the pool would not give keeps the template's")
}

// TestPlanPoolGrantsReplacementsWithinTheSurge: members whose workflows ask to replace
// their instances (bans, maxAge, ill health) are let go within maxSurge, the least useful
// first, together with a rollout's updates; a grant counts as in flight until the member
// says Replacing (and then as replacing), is sent again when it goes unanswered, and its
// annotation goes once the replacement started or is no longer wanted. With maxSurge 0
// such members are replaced delete-first within maxUnavailable, as outdated ones are.
func TestPlanPoolGrantsReplacementsWithinTheSurge(t *testing.T) {
	now := poolT0.Add(time.Hour)
	banned := func(mut func(i int, m *member)) []member {
		var ms []member
		for i := range 10 {
			m := readyMember(i)
			m.pending = true
			if mut != nil {
				mut(i, &m)
			}
			ms = append(ms, m)
		}
		return ms
	}
	t.Run("every member banned: maxSurge granted", func(t *testing.T) {
		p := planPool(poolInput{desired: 10, surge: 2, members: banned(nil), now: now})
		assert.Equal(t, []string{"eu-0", "eu-1"}, p.grant)
		assert.Empty(t, p.update)
		assert.Empty(t, p.replace)
	})
	t.Run("granted ones count until their replacement is done", func(t *testing.T) {
		members := banned(func(i int, m *member) {
			if i < 2 {
				m.granted, m.grantedAt = true, now.Add(-time.Second)
			}
		})
		p := planPool(poolInput{desired: 10, surge: 2, members: members, now: now})
		assert.Empty(t, p.grant, "the grants not yet answered fill the budget")
		assert.Empty(t, p.regrant)

		members[0].pending, members[0].replacing = false, true // eu-0's replacement started
		p = planPool(poolInput{desired: 10, surge: 2, members: members, now: now})
		assert.Empty(t, p.grant, "replacing counts as the grant did")
		assert.Equal(t, []string{"eu-0"}, p.ungrant)

		members[0].granted, members[0].replacing = false, false // promoted
		p = planPool(poolInput{desired: 10, surge: 2, members: members, now: now})
		assert.Equal(t, []string{"eu-2"}, p.grant)
	})
	t.Run("a grant unanswered is sent again", func(t *testing.T) {
		members := banned(func(i int, m *member) {
			if i == 0 {
				m.granted, m.grantedAt = true, now.Add(-regrantAfter)
			}
		})
		p := planPool(poolInput{desired: 10, surge: 1, members: members, now: now})
		assert.Equal(t, []string{"eu-0"}, p.regrant)
		assert.Empty(t, p.grant)
	})
	t.Run("a rollout and the asked share one budget, the least useful first", func(t *testing.T) {
		members := banned(func(i int, m *member) {
			m.current = i >= 5
			m.pending = i == 8
			m.ready = i != 8
		})
		p := planPool(poolInput{desired: 10, surge: 2, members: members, now: now})
		assert.Equal(t, []string{"eu-8"}, p.grant, "not Ready: first")
		assert.Equal(t, []string{"eu-0"}, p.update)
	})
	t.Run("an outdated member that asks is updated, not granted", func(t *testing.T) {
		members := banned(func(i int, m *member) { m.current = false })
		p := planPool(poolInput{desired: 10, surge: 1, members: members, now: now})
		assert.Equal(t, []string{"eu-0"}, p.update)
		assert.Empty(t, p.grant)
	})
	t.Run("maxSurge 0: delete-first within maxUnavailable", func(t *testing.T) {
		p := planPool(poolInput{desired: 10, unavailable: 1, members: banned(nil), now: now})
		assert.Equal(t, []string{"eu-0"}, p.replace)
		assert.Empty(t, p.grant)
	})
	t.Run("a grant no longer wanted goes", func(t *testing.T) {
		members := banned(func(i int, m *member) {
			m.pending = false
			if i == 3 {
				m.granted, m.grantedAt = true, now
			}
		})
		p := planPool(poolInput{desired: 10, surge: 2, members: members, now: now})
		assert.Equal(t, []string{"eu-3"}, p.ungrant)
	})
}
