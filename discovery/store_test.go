package discovery

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock is the store's time in tests: it moves only when a test advances it.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

const testKeepExpired = 30 * time.Minute

func newTestStore(t *testing.T) (*Store, *fakeClock) {
	t.Helper()
	s := NewStore(testKeepExpired)
	s.rankOf = idRank
	clk := newFakeClock()
	s.SetClock(clk.Now)
	return s, clk
}

// idRank orders proxies never leased by their ID's first 8 bytes, instead of at random,
// so that tests know which comes first.
func idRank(id string) uint64 {
	var b [8]byte
	copy(b[:], id)
	return binary.BigEndian.Uint64(b[:])
}

// px is a healthy proxy taking one lease.
func px(name string, latency int64, attrs map[string]string) Proxy {
	return Proxy{Name: name, Namespace: "ns", IP: "10.0.0.1", Port: 3128, Attributes: attrs,
		LatencyMillis: latency, Healthy: true, Phase: "Ready", MaxLeases: 1}
}

func withMax(p Proxy, n int) Proxy { p.MaxLeases = n; return p }

func unhealthy(p Proxy) Proxy { p.Healthy = false; return p }

// withUnresolved is p as the refresher leaves a proxy whose credentials did not resolve,
// except still marked healthy.
func withUnresolved(p Proxy) Proxy {
	p.CredentialsUnresolved = CredentialsUnknownKey
	return p
}

func acquireName(t *testing.T, s *Store, sel Selector, target string) string {
	t.Helper()
	l, err := s.Acquire(sel, target, time.Minute)
	require.NoError(t, err)
	return l.Proxy.Name
}

// requireNoMatch checks an acquire finds nothing, for the reasons in want. RetryAfter is
// checked only when want has one (TestRetryAfter covers it).
func requireNoMatch(t *testing.T, s *Store, sel Selector, target string, want NoMatch) {
	t.Helper()
	l, err := s.Acquire(sel, target, time.Minute)
	require.Nil(t, l, "no lease expected")
	var nm *NoMatch
	require.ErrorAs(t, err, &nm)
	got := *nm
	if want.RetryAfter == 0 {
		got.RetryAfter = 0
	}
	assert.Equal(t, want, got)
	assert.Equal(t, nm.Considered, nm.Unhealthy+nm.AtCapacity+nm.InCooldown, "NoMatch numbers add up")
}

func listNames(s *Store, sel Selector, healthy *bool) []string {
	var out []string
	for _, p := range s.List(sel, healthy) {
		out = append(out, p.Name)
	}
	return out
}

// checkInvariants recomputes from scratch what the store maintains incrementally: lease
// counts, each view's counters, tree contents and order, and which views each proxy is in.
func checkInvariants(t *testing.T, s *Store) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	held := map[string]int{}
	for _, l := range s.leases {
		held[l.proxyID]++
	}
	healthy := 0
	unresolved := map[string]int{}
	for id, e := range s.proxies {
		if e.p.Healthy {
			healthy++
		}
		if e.p.CredentialsUnresolved != "" {
			unresolved[e.p.CredentialsUnresolved]++
			require.False(t, e.p.Healthy, "%s: healthy without its credentials", id)
		}
	}
	require.Equal(t, healthy, s.healthy, "healthy count")
	require.Equal(t, unresolved, s.unresolved, "unresolved credentials by reason")
	for id, e := range s.proxies {
		require.Equal(t, held[id], e.leaseCount(), "%s: lease count", id)
		for _, l := range e.held {
			require.Same(t, l, s.leases[l.key], "%s: holds a lease the store does not", id)
		}
		require.Equal(t, e.available(), e.inTrees, "%s: in trees iff available", id)
		require.Equal(t, e.inTrees, e.onRing, "%s: on the rings iff in the trees", id)
		var want []string
		for key, v := range s.views {
			if v.sel.Matches(e.p.Attributes) {
				want = append(want, key)
			}
		}
		var got []string
		for _, v := range e.views {
			got = append(got, v.key)
		}
		require.ElementsMatch(t, want, got, "%s: views", id)
	}
	for key, v := range s.views {
		var matching, healthy, full int
		var avail []*entry
		for _, e := range s.proxies {
			if !v.sel.Matches(e.p.Attributes) {
				continue
			}
			matching++
			if e.p.Healthy {
				healthy++
				if e.leaseCount() >= e.p.MaxLeases {
					full++
				}
			}
			if e.available() {
				avail = append(avail, e)
			}
		}
		require.Equal(t, matching, v.matching, "view %q: matching", key)
		require.Equal(t, healthy, v.healthy, "view %q: healthy", key)
		require.Equal(t, full, v.full, "view %q: full", key)
		slices.SortFunc(avail, func(a, b *entry) int {
			if less(a, b) {
				return -1
			}
			return 1
		})
		var inTree []*entry
		v.tree.Ascend(func(e *entry) bool { inTree = append(inTree, e); return true })
		require.Equal(t, avail, inTree, "view %q: tree holds the available proxies in order", key)
		slices.SortFunc(avail, func(a, b *entry) int {
			if ringLess(a, b) {
				return -1
			}
			return 1
		})
		var onRing []*entry
		v.ring.Ascend(func(e *entry) bool { onRing = append(onRing, e); return true })
		require.Equal(t, avail, onRing, "view %q: ring holds the available proxies in order", key)
	}
	require.LessOrEqual(t, len(s.views), s.maxViews)
}

func TestSelectionOrder(t *testing.T) {
	tests := []struct {
		name    string
		proxies []Proxy
		want    []string // names in the order successive acquires return them
	}{
		{
			// Latency plays no part: the fastest proxy would otherwise take every lease.
			name: "fewest leases, then leased longest ago, then rank",
			proxies: []Proxy{
				withMax(px("a", 30, nil), 2), withMax(px("c", 10, nil), 2), withMax(px("b", 10, nil), 2),
			},
			want: []string{"a", "b", "c", "a", "b", "c"},
		},
		{
			name: "capacity differs",
			proxies: []Proxy{
				withMax(px("slow", 50, nil), 3), px("fast", 1, nil),
			},
			want: []string{"fast", "slow", "slow", "slow"},
		},
		{
			name:    "unhealthy never offered",
			proxies: []Proxy{unhealthy(px("sick", 1, nil)), withMax(px("well", 99, nil), 2)},
			want:    []string{"well", "well"},
		},
		{
			// Marked healthy on purpose: the store, not only the refresher, keeps a proxy
			// whose credentials did not resolve from crawlers.
			name:    "unresolved credentials never offered",
			proxies: []Proxy{withUnresolved(px("locked", 1, nil)), withMax(px("well", 99, nil), 2)},
			want:    []string{"well", "well"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestStore(t)
			for _, p := range tc.proxies {
				s.Upsert(p)
			}
			var got []string
			for range tc.want {
				got = append(got, acquireName(t, s, nil, ""))
				checkInvariants(t, s)
			}
			assert.Equal(t, tc.want, got)
			healthy := 0
			for _, p := range tc.proxies {
				if p.Healthy && p.CredentialsUnresolved == "" {
					healthy++
				}
			}
			requireNoMatch(t, s, nil, "", NoMatch{Considered: len(tc.proxies),
				AtCapacity: healthy, Unhealthy: len(tc.proxies) - healthy})
		})
	}
}

func TestNameTieBreakUsesNamespace(t *testing.T) {
	s, _ := newTestStore(t)
	a := px("z", 10, nil)
	a.Namespace = "a"
	b := px("a", 10, nil)
	b.Namespace = "b"
	s.Upsert(b)
	s.Upsert(a)
	l, err := s.Acquire(nil, "", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, "a/z", l.ProxyID, "ties break on namespace/name")
}

func TestCooldowns(t *testing.T) {
	const target, other = "shop.example", "news.example"
	tests := []struct {
		name string
		// cool puts p in cooldown for target (""=all) until the given time.
		cool func(s *Store, p Proxy, target string, until time.Time)
	}{
		{"local", func(s *Store, p Proxy, target string, until time.Time) { s.Cooldown(p.ID(), target, until) }},
		{"durable from the memo", func(s *Store, p Proxy, target string, until time.Time) {
			p.Cooldowns = map[string]time.Time{target: until}
			s.Upsert(p)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name+"/per target", func(t *testing.T) {
			s, clk := newTestStore(t)
			p := withMax(px("p", 10, nil), 10)
			s.Upsert(p)
			tc.cool(s, p, target, clk.Now().Add(5*time.Minute))
			requireNoMatch(t, s, nil, target, NoMatch{Considered: 1, InCooldown: 1})
			assert.Equal(t, "p", acquireName(t, s, nil, other), "cooling for one target only")
			assert.Equal(t, "p", acquireName(t, s, nil, ""), "a lease for no target ignores per-target cooldowns")
			clk.Advance(5*time.Minute - time.Nanosecond)
			requireNoMatch(t, s, nil, target, NoMatch{Considered: 1, InCooldown: 1})
			clk.Advance(time.Nanosecond)
			assert.Equal(t, "p", acquireName(t, s, nil, target), "cooldown over")
			checkInvariants(t, s)
		})
		t.Run(tc.name+"/global", func(t *testing.T) {
			s, clk := newTestStore(t)
			p := withMax(px("p", 10, nil), 10)
			s.Upsert(p)
			s.Upsert(withMax(px("q", 99, nil), 10))
			tc.cool(s, p, "", clk.Now().Add(time.Minute))
			for _, tgt := range []string{target, other, ""} {
				assert.Equal(t, "q", acquireName(t, s, nil, tgt), "target %q", tgt)
			}
			tc.cool(s, withMax(px("q", 99, nil), 10), "", clk.Now().Add(time.Minute))
			requireNoMatch(t, s, nil, "", NoMatch{Considered: 2, InCooldown: 2})
			checkInvariants(t, s)
		})
	}
}

func TestCooldownKeepsTheLatest(t *testing.T) {
	s, clk := newTestStore(t)
	p := px("p", 1, nil)
	s.Upsert(p)
	s.Cooldown(p.ID(), "t", clk.Now().Add(10*time.Minute))
	s.Cooldown(p.ID(), "t", clk.Now().Add(time.Minute)) // an earlier end does not shorten it
	clk.Advance(2 * time.Minute)
	requireNoMatch(t, s, nil, "t", NoMatch{Considered: 1, InCooldown: 1})
}

func TestCapacity(t *testing.T) {
	s, _ := newTestStore(t)
	s.Upsert(withMax(px("p", 1, map[string]string{"region": "eu"}), 2))
	sel := Selector{"region": "eu"}
	l1, err := s.Acquire(sel, "", time.Minute)
	require.NoError(t, err)
	_, err = s.Acquire(sel, "", time.Minute)
	require.NoError(t, err)
	requireNoMatch(t, s, sel, "", NoMatch{Considered: 1, AtCapacity: 1})
	s.Release("", l1.ID)
	assert.Equal(t, "p", acquireName(t, s, sel, ""), "offered again after a release")
	s.Release("", l1.ID) // twice: no effect on the count
	requireNoMatch(t, s, sel, "", NoMatch{Considered: 1, AtCapacity: 1})
	checkInvariants(t, s)

	t.Run("maxLeases 0 means 1", func(t *testing.T) {
		s, _ := newTestStore(t)
		s.Upsert(withMax(px("p", 1, nil), 0))
		acquireName(t, s, nil, "")
		requireNoMatch(t, s, nil, "", NoMatch{Considered: 1, AtCapacity: 1})
	})
}

// TestNoMatchAddsUp mixes every reason a matching proxy is not offered.
func TestNoMatchAddsUp(t *testing.T) {
	const target = "shop.example"
	s, clk := newTestStore(t)
	eu := map[string]string{"region": "eu"}
	s.Upsert(unhealthy(px("u1", 1, eu)))
	s.Upsert(unhealthy(withMax(px("u2", 1, eu), 5)))
	s.Upsert(px("a", 1, eu))
	s.Upsert(px("b", 2, eu))
	s.Upsert(withMax(px("c", 3, eu), 2))
	s.Upsert(px("other", 1, map[string]string{"region": "us"}))
	sel := Selector{"region": "eu"}
	require.Equal(t, "a", acquireName(t, s, sel, ""))
	require.Equal(t, "b", acquireName(t, s, sel, ""))
	// c: cooling for target; b: at capacity and cooling (counted at capacity only).
	s.Cooldown("ns/c", target, clk.Now().Add(time.Minute))
	s.Cooldown("ns/b", "", clk.Now().Add(time.Minute))
	requireNoMatch(t, s, sel, target, NoMatch{Considered: 5, Unhealthy: 2, AtCapacity: 2, InCooldown: 1})
	// Without a target, c is free.
	assert.Equal(t, "c", acquireName(t, s, sel, ""))
	requireNoMatch(t, s, sel, target, NoMatch{Considered: 5, Unhealthy: 2, AtCapacity: 2, InCooldown: 1})
	checkInvariants(t, s)
}

func TestUpsertMovesBetweenViews(t *testing.T) {
	s, _ := newTestStore(t)
	eu, us := Selector{"region": "eu"}, Selector{"region": "us"}
	s.Upsert(withMax(px("p", 1, map[string]string{"region": "eu"}), 5))
	l, err := s.Acquire(eu, "", time.Minute) // builds the eu view
	require.NoError(t, err)
	requireNoMatch(t, s, us, "", NoMatch{}) // builds the us view, empty

	s.Upsert(withMax(px("p", 1, map[string]string{"region": "us"}), 5))
	checkInvariants(t, s)
	requireNoMatch(t, s, eu, "", NoMatch{})
	assert.Equal(t, "p", acquireName(t, s, us, ""), "moved into the existing us view")
	assert.Empty(t, listNames(s, eu, nil))
	assert.Equal(t, []string{"p"}, listNames(s, us, nil))
	assert.Equal(t, 2, s.List(us, nil)[0].ActiveLeases, "leases survive an attribute change")

	s.Upsert(withMax(px("p", 1, map[string]string{"region": "eu", "tier": "gold"}), 5))
	checkInvariants(t, s)
	requireNoMatch(t, s, us, "", NoMatch{})
	assert.Equal(t, "p", acquireName(t, s, eu, ""))
	assert.Equal(t, "p", acquireName(t, s, Selector{"region": "eu", "tier": "gold"}, ""))
	s.Release("", l.ID)
	checkInvariants(t, s)
}

func TestUpsertReorders(t *testing.T) {
	s, _ := newTestStore(t)
	s.Upsert(withMax(px("a", 10, nil), 5))
	s.Upsert(withMax(px("b", 20, nil), 5))
	pick := func() string {
		t.Helper()
		l, err := s.Acquire(nil, "", time.Minute)
		require.NoError(t, err)
		s.Release("", l.ID)
		return l.Proxy.Name
	}
	assert.Equal(t, "a", pick())
	s.Upsert(withMax(px("a", 1, nil), 5))
	checkInvariants(t, s)
	assert.Equal(t, "b", pick(), "a got faster, but was leased more recently")
	s.Upsert(unhealthy(withMax(px("b", 20, nil), 5)))
	checkInvariants(t, s)
	assert.Equal(t, "a", pick(), "b fell sick")
	s.Upsert(withMax(px("b", 20, nil), 5))
	checkInvariants(t, s)
	assert.Equal(t, "b", pick(), "b recovered, and was leased longest ago")
}

func TestRemove(t *testing.T) {
	s, _ := newTestStore(t)
	eu := map[string]string{"region": "eu"}
	s.Upsert(px("a", 1, eu))
	s.Upsert(px("b", 2, eu))
	sel := Selector{"region": "eu"}
	la, err := s.Acquire(sel, "", time.Minute)
	require.NoError(t, err)
	require.Equal(t, "a", la.Proxy.Name)

	s.Remove("ns/b")
	checkInvariants(t, s)
	assert.Equal(t, 1, s.Len())
	requireNoMatch(t, s, sel, "", NoMatch{Considered: 1, AtCapacity: 1})
	assert.Equal(t, []string{"a"}, listNames(s, sel, nil))
	s.Remove("ns/b") // unknown: no effect

	s.Remove("ns/a")
	checkInvariants(t, s)
	requireNoMatch(t, s, sel, "", NoMatch{})
	assert.Equal(t, 0, s.Len())
	assert.Equal(t, 1, s.Stats().Leases, "leases outlive their proxy until released")
	_, err = s.Lookup("", la.ID)
	assert.NoError(t, err, "a removed proxy's lease still takes reports")

	t.Run("back while leased keeps its lease count", func(t *testing.T) {
		s.Upsert(px("a", 1, eu))
		checkInvariants(t, s)
		requireNoMatch(t, s, sel, "", NoMatch{Considered: 1, AtCapacity: 1})
		s.Release("", la.ID)
		checkInvariants(t, s)
		assert.Equal(t, "a", acquireName(t, s, sel, ""))
	})
	t.Run("release after removal", func(t *testing.T) {
		s, _ := newTestStore(t)
		s.Upsert(px("a", 1, nil))
		l, err := s.Acquire(nil, "", time.Minute)
		require.NoError(t, err)
		s.Remove("ns/a")
		s.Release("", l.ID)
		s.Upsert(px("a", 1, nil))
		checkInvariants(t, s)
		assert.Equal(t, 0, s.List(nil, nil)[0].ActiveLeases)
	})
}

func TestReplaceAll(t *testing.T) {
	s, _ := newTestStore(t)
	s.Upsert(px("keep", 5, nil))
	s.Upsert(px("drop", 1, nil))
	l, err := s.Acquire(nil, "", time.Minute)
	require.NoError(t, err)
	require.Equal(t, "drop", l.Proxy.Name)
	k, err := s.Acquire(nil, "", time.Minute)
	require.NoError(t, err)
	require.Equal(t, "keep", k.Proxy.Name)

	s.ReplaceAll([]Proxy{withMax(px("keep", 5, nil), 2), px("new", 9, nil)})
	checkInvariants(t, s)
	assert.Equal(t, []string{"keep", "new"}, listNames(s, nil, nil))
	got := s.List(nil, nil)
	assert.Equal(t, 1, got[0].ActiveLeases, "kept proxies keep their leases")
	assert.Equal(t, 2, got[0].MaxLeases, "and take the new spec")
	assert.Equal(t, "new", acquireName(t, s, nil, ""))
	assert.Equal(t, "keep", acquireName(t, s, nil, ""))
	requireNoMatch(t, s, nil, "", NoMatch{Considered: 2, AtCapacity: 2})

	s.ReplaceAll(nil)
	checkInvariants(t, s)
	assert.Equal(t, 0, s.Len())
	requireNoMatch(t, s, nil, "", NoMatch{})
}

// TestLoaded: only a full pass (ReplaceAll) loads the index, even an empty one, and it
// stays loaded: later passes, or none, never unload it.
func TestLoaded(t *testing.T) {
	s, _ := newTestStore(t)
	assert.False(t, s.Loaded(), "a new store")
	s.Upsert(px("a", 1, nil))
	s.Remove("ns/a")
	s.Upsert(px("b", 1, nil))
	assert.False(t, s.Loaded(), "incremental passes only see what changed, never the whole fleet")

	s.ReplaceAll(nil)
	assert.True(t, s.Loaded(), "an empty fleet is a loaded index too")
	assert.Equal(t, 0, s.Len())

	s.Upsert(px("c", 1, nil))
	s.Remove("ns/c")
	s.ReplaceAll([]Proxy{px("d", 1, nil)})
	assert.True(t, s.Loaded())
}

func TestExpiry(t *testing.T) {
	s, clk := newTestStore(t)
	s.Upsert(px("p", 1, nil))
	l, err := s.Acquire(nil, "shop.example", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, clk.Now().Add(time.Minute), l.ExpiresAt)

	clk.Advance(30 * time.Second)
	r, err := s.Renew("", l.ID, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, clk.Now().Add(time.Minute), r.ExpiresAt, "renewal counts from now")

	clk.Advance(time.Minute)
	requireNoMatch(t, s, nil, "", NoMatch{Considered: 1, AtCapacity: 1})
	s.Sweep()
	checkInvariants(t, s)
	assert.Equal(t, 0, s.Stats().Leases)
	assert.Equal(t, 0, s.List(nil, nil)[0].ActiveLeases)
	got, err := s.Lookup("", l.ID)
	require.NoError(t, err, "an expired lease takes reports within the window")
	assert.Equal(t, "shop.example", got.Target)
	assert.Equal(t, "ns/p", got.ProxyID)
	_, err = s.Renew("", l.ID, time.Minute)
	assert.ErrorIs(t, err, ErrLeaseExpired)

	l2, err := s.Acquire(nil, "", time.Minute)
	require.NoError(t, err, "offered again after the sweep")
	assert.Equal(t, "p", l2.Proxy.Name)

	clk.Advance(testKeepExpired - time.Second)
	_, err = s.Lookup("", l.ID)
	require.NoError(t, err, "just inside the window")
	clk.Advance(time.Second)
	_, err = s.Lookup("", l.ID)
	assert.ErrorIs(t, err, ErrUnknownLease, "window over")
	s.Sweep()
	_, err = s.Renew("", l.ID, time.Minute)
	assert.ErrorIs(t, err, ErrUnknownLease, "forgotten after the window")
	checkInvariants(t, s)
}

func TestExpiryWithoutSweep(t *testing.T) {
	s, clk := newTestStore(t)
	s.Upsert(px("p", 1, nil))
	l, err := s.Acquire(nil, "", time.Minute)
	require.NoError(t, err)
	clk.Advance(time.Minute)
	_, err = s.Lookup("", l.ID)
	require.NoError(t, err, "expired just now")
	clk.Advance(testKeepExpired)
	_, err = s.Lookup("", l.ID)
	assert.ErrorIs(t, err, ErrUnknownLease, "expired longer ago than the window, even before a sweep")
	checkInvariants(t, s)

	l, err = s.Acquire(nil, "", time.Minute)
	require.NoError(t, err)
	clk.Advance(time.Minute)
	_, err = s.Renew("", l.ID, time.Minute)
	assert.ErrorIs(t, err, ErrLeaseExpired, "renewal checks expiry itself")
	checkInvariants(t, s)
	_, err = s.Renew("", "nope", time.Minute)
	assert.ErrorIs(t, err, ErrUnknownLease)
	s.Release("", l.ID) // an expired lease: no effect
	checkInvariants(t, s)
}

func TestList(t *testing.T) {
	s, _ := newTestStore(t)
	s.Upsert(px("b", 1, map[string]string{"region": "eu", "country": "de"}))
	s.Upsert(px("a", 1, map[string]string{"region": "eu", "country": "fr"}))
	s.Upsert(unhealthy(px("c", 1, map[string]string{"region": "eu", "country": "de"})))
	s.Upsert(px("d", 1, map[string]string{"region": "us"}))
	s.Upsert(px("e", 1, nil))
	yes, no := true, false
	tests := []struct {
		name    string
		sel     Selector
		healthy *bool
		want    []string
	}{
		{"everything", nil, nil, []string{"a", "b", "c", "d", "e"}},
		{"empty selector", Selector{}, nil, []string{"a", "b", "c", "d", "e"}},
		{"one pair", Selector{"region": "eu"}, nil, []string{"a", "b", "c"}},
		{"two pairs", Selector{"region": "eu", "country": "de"}, nil, []string{"b", "c"}},
		{"healthy", Selector{"region": "eu", "country": "de"}, &yes, []string{"b"}},
		{"unhealthy", nil, &no, []string{"c"}},
		{"no such value", Selector{"region": "mars"}, nil, nil},
		{"no such key", Selector{"tier": "gold"}, nil, nil},
		{"pairs never together", Selector{"region": "us", "country": "de"}, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := s.List(tc.sel, tc.healthy)
			require.NotNil(t, got, "an empty list, not nil")
			assert.Equal(t, tc.want, listNames(s, tc.sel, tc.healthy))
		})
	}
	st := s.Stats()
	assert.Equal(t, Stats{Proxies: 5, Healthy: 4}, st)
}

// TestViewEviction runs the same random operations on a store that keeps one view and on
// one that keeps them all: every answer must be the same.
func TestViewEviction(t *testing.T) {
	for _, maxViews := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("maxViews=%d", maxViews), func(t *testing.T) {
			small, clkS := newTestStore(t)
			small.maxViews = maxViews
			big, clkB := newTestStore(t)
			rng := rand.New(rand.NewPCG(1, uint64(maxViews)))
			regions := []string{"eu", "us", "ap"}
			tiers := []string{"gold", "silver"}
			sels := []Selector{nil, {"region": "eu"}, {"region": "us"}, {"tier": "gold"},
				{"region": "eu", "tier": "gold"}, {"region": "ap", "tier": "silver"}}
			targets := []string{"", "a.example", "b.example"}
			randProxy := func() Proxy {
				p := withMax(px(fmt.Sprintf("p%d", rng.IntN(12)), int64(rng.IntN(5)),
					map[string]string{"region": regions[rng.IntN(3)], "tier": tiers[rng.IntN(2)]}), 1+rng.IntN(3))
				p.Healthy = rng.IntN(5) > 0
				return p
			}
			var held [][2]string // lease IDs in small, big
			for step := range 3000 {
				switch op := rng.IntN(10); {
				case op < 4:
					sel, target := sels[rng.IntN(len(sels))], targets[rng.IntN(len(targets))]
					ttl := time.Duration(1+rng.IntN(5)) * time.Minute
					ls, errS := small.Acquire(sel, target, ttl)
					lb, errB := big.Acquire(sel, target, ttl)
					require.Equal(t, errB, errS, "step %d: acquire %v for %q", step, sel, target)
					if errS == nil {
						require.Equal(t, lb.ProxyID, ls.ProxyID, "step %d", step)
						held = append(held, [2]string{ls.ID, lb.ID})
					}
				case op < 6 && len(held) > 0:
					i := rng.IntN(len(held))
					small.Release("", held[i][0])
					big.Release("", held[i][1])
					held = slices.Delete(held, i, i+1)
				case op < 8:
					p := randProxy()
					small.Upsert(p)
					big.Upsert(p)
				case op < 9:
					id := fmt.Sprintf("ns/p%d", rng.IntN(12))
					if rng.IntN(2) == 0 {
						until := clkS.Now().Add(time.Duration(rng.IntN(3)) * time.Minute)
						target := targets[rng.IntN(len(targets))]
						small.Cooldown(id, target, until)
						big.Cooldown(id, target, until)
					} else {
						small.Remove(id)
						big.Remove(id)
					}
				default:
					clkS.Advance(30 * time.Second)
					clkB.Advance(30 * time.Second)
					small.Sweep()
					big.Sweep()
				}
				if step%50 == 0 {
					checkInvariants(t, small)
					checkInvariants(t, big)
				}
				require.Equal(t, big.List(nil, nil), small.List(nil, nil), "step %d", step)
			}
			checkInvariants(t, small)
			assert.LessOrEqual(t, small.Stats().Views, maxViews)
			assert.Equal(t, len(sels), big.Stats().Views)
		})
	}
}

// TestConcurrentLeases runs acquires, releases, upserts and removals at once (run it with
// -race); afterwards every proxy counts exactly the leases the goroutines hold.
func TestConcurrentLeases(t *testing.T) {
	s, _ := newTestStore(t)
	const proxies, workers, rounds = 12, 16, 400
	regions := []string{"eu", "us"}
	proxy := func(i, latency int, region string) Proxy {
		return withMax(px(fmt.Sprintf("p%02d", i), int64(latency), map[string]string{"region": region}), 3)
	}
	for i := range proxies {
		s.Upsert(proxy(i, i, regions[i%2]))
	}
	sels := []Selector{nil, {"region": "eu"}, {"region": "us"}}
	heldBy := make([][]*Lease, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var held []*Lease
			for range rounds {
				switch op := rng.IntN(10); {
				case op < 5:
					if l, err := s.Acquire(sels[rng.IntN(3)], "", time.Hour); err == nil {
						held = append(held, l)
					}
				case op < 8 && len(held) > 0:
					i := rng.IntN(len(held))
					s.Release("", held[i].ID)
					held = slices.Delete(held, i, i+1)
				case op < 9:
					i := rng.IntN(proxies)
					p := proxy(i, rng.IntN(100), regions[rng.IntN(2)])
					if rng.IntN(3) == 0 {
						p = withUnresolved(p)
					}
					s.Upsert(p)
				default:
					i := rng.IntN(proxies)
					s.Remove(fmt.Sprintf("ns/p%02d", i))
					s.Upsert(proxy(i, rng.IntN(100), regions[i%2]))
				}
			}
			heldBy[w] = held
		}()
	}
	wg.Wait()

	want := map[string]int{}
	total := 0
	for _, held := range heldBy {
		for _, l := range held {
			want[l.ProxyID]++
			total++
		}
	}
	for _, p := range s.List(nil, nil) {
		assert.GreaterOrEqual(t, p.ActiveLeases, 0, p.ID())
		assert.LessOrEqual(t, p.ActiveLeases, p.MaxLeases, p.ID())
		assert.Equal(t, want[p.ID()], p.ActiveLeases, p.ID())
	}
	assert.Equal(t, total, s.Stats().Leases)
	checkInvariants(t, s)
	for _, held := range heldBy {
		for _, l := range held {
			s.Release("", l.ID)
		}
	}
	for _, p := range s.List(nil, nil) {
		assert.Equal(t, 0, p.ActiveLeases, p.ID())
	}
	checkInvariants(t, s)
}

// TestRunSweeperEndsExpiredLeases: the loop both binaries run sweeps on its own and stops
// with its context.
func TestRunSweeperEndsExpiredLeases(t *testing.T) {
	s, clk := newTestStore(t)
	s.Upsert(px("p", 1, nil))
	_, err := s.Acquire(nil, "", time.Minute)
	require.NoError(t, err)
	clk.Advance(2 * time.Minute)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.RunSweeper(ctx, 5*time.Millisecond); close(done) }()
	require.Eventually(t, func() bool { return s.Stats().Leases == 0 }, 5*time.Second, 5*time.Millisecond, "the expired lease was never swept")
	cancel()
	<-done
	checkInvariants(t, s)
}

// TestRotationWalksTheFleet: crawlers that lease per request (acquire, one fetch,
// release) spread over the whole fleet instead of all going through one proxy, and
// consecutive leases for one site never repeat a proxy before every proxy had a turn.
func TestRotationWalksTheFleet(t *testing.T) {
	s, _ := newTestStore(t)
	s.rankOf = func(string) uint64 { return rand.Uint64() } // as in production
	for i := range 100 {
		s.Upsert(px(fmt.Sprintf("p%03d", i), int64(i), nil))
	}
	uses := map[string]int{}
	var window []string
	for i := range 1000 {
		target := "shop.example"
		if i%3 == 0 {
			target = "news.example" // another site in between does not break the walk
		}
		l, err := s.Acquire(nil, target, time.Minute)
		require.NoError(t, err)
		s.Release("", l.ID)
		uses[l.Proxy.Name]++
		if target == "shop.example" {
			window = append(window, l.Proxy.Name)
		}
	}
	require.Len(t, uses, 100, "every proxy served")
	lo, hi := 1000, 0
	for _, n := range uses {
		lo, hi = min(lo, n), max(hi, n)
	}
	assert.LessOrEqual(t, float64(hi)/float64(lo), 1.5, "max/min uses per proxy: %d/%d", hi, lo)
	// Any 50 consecutive leases for shop.example went through 50 different proxies.
	for i := 0; i+50 <= len(window); i++ {
		seen := map[string]bool{}
		for _, n := range window[i : i+50] {
			seen[n] = true
		}
		require.Len(t, seen, 50, "leases %d..%d for one site repeated a proxy", i, i+50)
	}
	checkInvariants(t, s)
}

// TestSessions: a session keeps its proxy across leases while the proxy can take it, moves
// when it cannot (unhealthy, cooling down for the target, at capacity), and lands on the
// same proxy in another store (another replica, or after a restart) with the same fleet.
func TestSessions(t *testing.T) {
	fleet := func(s *Store) {
		for i := range 20 {
			s.Upsert(withMax(px(fmt.Sprintf("p%02d", i), 1, map[string]string{"pool": "a"}), 2))
		}
	}
	s, clk := newTestStore(t)
	fleet(s)
	lease := func(s *Store, session, target string) *Lease {
		t.Helper()
		l, err := s.Lease(Want{Selector: Selector{"pool": "a"}, Target: target, Session: session, TTL: time.Minute})
		require.NoError(t, err)
		return l
	}
	first := lease(s, "crawl-1", "shop.example")
	assert.Equal(t, "crawl-1", first.Session)
	for range 10 {
		l := lease(s, "crawl-1", "shop.example")
		assert.Equal(t, first.ProxyID, l.ProxyID, "same session, same proxy")
		s.Release("", l.ID)
	}
	// Sessions spread: 50 sessions do not share a handful of proxies.
	used := map[string]bool{}
	for i := range 50 {
		l := lease(s, fmt.Sprintf("s-%d", i), "")
		used[l.ProxyID] = true
		s.Release("", l.ID)
	}
	assert.Greater(t, len(used), 10, "50 sessions over 20 proxies used only %d", len(used))

	// Another replica, or this one after a restart, places the session on the same proxy.
	other, _ := newTestStore(t)
	fleet(other)
	assert.Equal(t, first.ProxyID, lease(other, "crawl-1", "shop.example").ProxyID)

	// A proxy joining the fleet does not move the session (it is remembered).
	s.Upsert(withMax(px("newcomer", 1, map[string]string{"pool": "a"}), 2))
	assert.Equal(t, first.ProxyID, lease(s, "crawl-1", "").ProxyID)

	// Cooling down for the target: the session moves, and stays where it moved.
	s.Cooldown(first.ProxyID, "shop.example", clk.Now().Add(time.Minute))
	moved := lease(s, "crawl-1", "shop.example")
	assert.NotEqual(t, first.ProxyID, moved.ProxyID)
	assert.Equal(t, moved.ProxyID, lease(s, "crawl-1", "").ProxyID)

	// Unhealthy: it moves again.
	e := s.proxies[moved.ProxyID]
	s.Upsert(unhealthy(*e.p))
	again := lease(s, "crawl-1", "")
	assert.NotEqual(t, moved.ProxyID, again.ProxyID)
	checkInvariants(t, s)
}

// TestRenewTellsTheTruth: renewing a lease whose proxy was replaced, turned unhealthy or
// left the fleet ends the lease with that reason (and keeps saying so), instead of
// extending it on another address; the ended lease still takes reports.
func TestRenewTellsTheTruth(t *testing.T) {
	tests := []struct {
		name   string
		change func(s *Store, p Proxy)
		reason string
	}{
		{"new address", func(s *Store, p Proxy) { p.IP = "10.9.9.9"; s.Upsert(p) }, ProxyGoneReplaced},
		{"new port", func(s *Store, p Proxy) { p.Port = 4000; s.Upsert(p) }, ProxyGoneReplaced},
		{"new instance, same address", func(s *Store, p Proxy) { p.Instance = "pf-2"; s.Upsert(p) }, ProxyGoneReplaced},
		{"unhealthy", func(s *Store, p Proxy) { s.Upsert(unhealthy(p)) }, ProxyGoneUnhealthy},
		{"removed", func(s *Store, p Proxy) { s.Remove(p.ID()) }, ProxyGoneRemoved},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, clk := newTestStore(t)
			p := withMax(px("a", 1, nil), 2)
			p.Instance = "pf-1"
			s.Upsert(p)
			l, err := s.Acquire(nil, "shop.example", time.Minute)
			require.NoError(t, err)
			_, err = s.Renew("", l.ID, time.Minute)
			require.NoError(t, err, "nothing changed yet")
			p.LatencyMillis = 99 // a change that keeps the proxy: still renewable
			s.Upsert(p)
			_, err = s.Renew("", l.ID, time.Minute)
			require.NoError(t, err)

			tc.change(s, p)
			for range 2 {
				_, err = s.Renew("", l.ID, time.Minute)
				var gone *ProxyGone
				require.ErrorAs(t, err, &gone)
				assert.Equal(t, tc.reason, gone.Reason)
			}
			checkInvariants(t, s)
			assert.Zero(t, s.Stats().Leases, "the lease ended")
			_, target, err := s.Report("", l.ID, "", clk.Now().Add(time.Minute))
			require.NoError(t, err, "an ended lease still takes reports")
			assert.Equal(t, "shop.example", target)
		})
	}
}

// TestRetryAfter: a refused acquire says when the first matching proxy frees up: the
// earliest lease expiry on a proxy at capacity or cooldown end for the target; nothing
// when no matching proxy will free up by itself.
func TestRetryAfter(t *testing.T) {
	s, clk := newTestStore(t)
	pool := map[string]string{"pool": "a"}
	s.Upsert(px("busy", 1, pool))
	s.Upsert(px("resting", 1, pool))
	s.Upsert(unhealthy(px("sick", 1, pool)))
	_, err := s.Lease(Want{Selector: Selector{"pool": "a"}, TTL: 90 * time.Second})
	require.NoError(t, err) // busy (ranked first)
	s.Cooldown("ns/resting", "shop.example", clk.Now().Add(40*time.Second))
	s.Cooldown("ns/resting", "", clk.Now().Add(20*time.Second))
	// resting is free for shop.example only when both its cooldowns end: 40s.
	requireNoMatch(t, s, Selector{"pool": "a"}, "shop.example",
		NoMatch{Considered: 3, Unhealthy: 1, AtCapacity: 1, InCooldown: 1, RetryAfter: 40 * time.Second})
	clk.Advance(30 * time.Second)
	requireNoMatch(t, s, Selector{"pool": "a"}, "shop.example",
		NoMatch{Considered: 3, Unhealthy: 1, AtCapacity: 1, InCooldown: 1, RetryAfter: 10 * time.Second})
	s.Cooldown("ns/resting", "shop.example", clk.Now().Add(time.Hour))
	requireNoMatch(t, s, Selector{"pool": "a"}, "shop.example",
		NoMatch{Considered: 3, Unhealthy: 1, AtCapacity: 1, InCooldown: 1, RetryAfter: time.Minute})
	clk.Advance(2 * time.Minute) // busy's lease expired, not yet swept: retry in a second, not now
	requireNoMatch(t, s, Selector{"pool": "a"}, "shop.example",
		NoMatch{Considered: 3, Unhealthy: 1, AtCapacity: 1, InCooldown: 1, RetryAfter: time.Second})
	assert.Zero(t, requireNoMatchErr(t, s, Selector{"pool": "a", "absent": "x"}, "").RetryAfter, "nothing matches")
	l, err := s.Lookup("", "00000000000000000000000000000000")
	assert.Nil(t, l)
	assert.ErrorIs(t, err, ErrUnknownLease, "a well-formed ID nobody was given")
	s.Upsert(unhealthy(px("busy", 1, pool)))
	s.Upsert(unhealthy(px("resting", 1, pool)))
	nm := requireNoMatchErr(t, s, Selector{"pool": "a"}, "")
	assert.Zero(t, nm.RetryAfter, "all unhealthy: waiting alone does not help")
}

func requireNoMatchErr(t *testing.T, s *Store, sel Selector, target string) *NoMatch {
	t.Helper()
	_, err := s.Acquire(sel, target, time.Minute)
	var nm *NoMatch
	require.ErrorAs(t, err, &nm)
	return nm
}

// TestBounds: what crawlers can make the store remember is capped, least recently used
// out: ended leases, cooldowns (in total and per proxy), sessions, and cooldowns reported
// per lease.
func TestBounds(t *testing.T) {
	s := NewStoreWith(StoreConfig{KeepEnded: time.Hour, MaxEnded: 10, MaxCooldowns: 50, MaxCooldownsPerProxy: 20,
		MaxSessions: 5, MaxReportsPerLease: 3})
	clk := newFakeClock()
	s.SetClock(clk.Now)
	for i := range 5 {
		s.Upsert(withMax(px(fmt.Sprintf("p%d", i), 1, nil), 1000))
	}
	var ids []string
	for range 100 {
		l, err := s.Acquire(nil, "", time.Minute)
		require.NoError(t, err)
		s.Release("", l.ID)
		ids = append(ids, l.ID)
	}
	assert.Equal(t, 10, s.Stats().Ended)
	_, err := s.Lookup("", ids[0])
	assert.ErrorIs(t, err, ErrUnknownLease, "the oldest ended lease was dropped")
	_, err = s.Lookup("", ids[99])
	assert.NoError(t, err, "the newest is kept")

	until := clk.Now().Add(time.Hour)
	for i := range 30 {
		s.Cooldown("ns/p0", fmt.Sprintf("t%d.example", i), until.Add(time.Duration(i)*time.Second))
	}
	assert.Equal(t, 20, s.Stats().Cooldowns, "per proxy cap")
	_, err = s.Acquire(nil, "t0.example", time.Minute) // p0's earliest-ending cooldowns went first
	require.NoError(t, err)
	for i := range 100 {
		s.Cooldown(fmt.Sprintf("ns/p%d", 1+i%4), fmt.Sprintf("u%d.example", i), until)
	}
	assert.Equal(t, 50, s.Stats().Cooldowns, "total cap")

	for i := range 20 {
		l, err := s.Lease(Want{Session: fmt.Sprintf("s%d", i), TTL: time.Minute})
		require.NoError(t, err)
		s.Release("", l.ID)
	}
	assert.Equal(t, 5, s.Stats().Sessions)

	l, err := s.Acquire(nil, "", time.Minute)
	require.NoError(t, err)
	for i := range 3 {
		_, _, err := s.Report("", l.ID, fmt.Sprintf("r%d.example", i), until)
		require.NoError(t, err)
	}
	_, _, err = s.Report("", l.ID, "r9.example", until)
	assert.ErrorIs(t, err, ErrReportLimit)
	_, _, err = s.Report("", l.ID, "r9.example", time.Time{})
	assert.NoError(t, err, "a success report is not counted")

	// Sweeping forgets what has run out, oldest first.
	clk.Advance(2 * time.Hour)
	s.Sweep()
	st := s.Stats()
	assert.Zero(t, st.Ended)
	assert.Zero(t, st.Sessions)
	assert.Zero(t, st.Cooldowns)
	checkInvariants(t, s)
}
