package discovery

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// Proxy is one proxy as the index knows it.
type Proxy struct {
	Name          string            `json:"name"`
	Namespace     string            `json:"namespace"`
	UID           string            `json:"uid,omitempty"`
	IP            string            `json:"ip"`
	Port          int32             `json:"port"`
	Attributes    map[string]string `json:"attributes,omitempty"`
	LatencyMillis int64             `json:"latencyMillis"`
	Healthy       bool              `json:"healthy"`
	Phase         string            `json:"phase,omitempty"`
	MaxLeases     int               `json:"maxLeases"`
	Provider      string            `json:"provider,omitempty"`
	// Cooldowns are the durable ones from the proxy's workflow: target ("" = all) → until.
	Cooldowns map[string]time.Time `json:"-"`
	// Credentials are what the proxy takes, resolved from its memo; empty when it takes
	// none. They stay in memory: only a lease answer carries them, copied into LeasedProxy
	// on purpose, and proxyauth.Credentials redacts the password anywhere else.
	Credentials proxyauth.Credentials `json:"-"`
	// CredentialsUnresolved, when set, says why the credentials the proxy's memo says it
	// takes could not be resolved (a Credentials* reason). Such a proxy is never leased:
	// the store counts it as unhealthy, whatever its health checks say, since a crawler
	// could not use it.
	CredentialsUnresolved string `json:"-"`
	// authNote explains CredentialsUnresolved to the refresher, which logs it.
	authNote *authNote
}

// ID is namespace/name, unique in the fleet.
func (p *Proxy) ID() string { return p.Namespace + "/" + p.Name }

// Lease is a proxy handed to a crawler until ExpiresAt.
type Lease struct {
	ID        string    `json:"leaseID"`
	ProxyID   string    `json:"-"`
	Target    string    `json:"target,omitempty"`
	ExpiresAt time.Time `json:"expiresAt"`
	// Proxy is a snapshot taken when the lease was granted.
	Proxy Proxy `json:"-"`
}

// NoMatch explains why no proxy was offered. The numbers add up: every proxy matching the
// selector is counted in exactly one of Unhealthy, AtCapacity or InCooldown.
type NoMatch struct {
	Considered int `json:"considered"`
	AtCapacity int `json:"atCapacity"`
	InCooldown int `json:"inCooldown"`
	Unhealthy  int `json:"unhealthy"`
}

func (n *NoMatch) Error() string { return "no proxy matches" }

// Errors of lease operations.
var (
	ErrUnknownLease = errors.New("unknown lease")
	ErrLeaseExpired = errors.New("lease expired")
)

// entry is a proxy with its lease count. It sits in the tree of every view it matches
// while it can take a lease (healthy and under maxLeases).
type entry struct {
	p      Proxy
	leases int
	views  []*view
	// inTrees is true while the entry is in its views' trees.
	inTrees bool
}

func (e *entry) available() bool { return e.p.Healthy && e.leases < e.p.MaxLeases }

// less orders candidates: fewest leases, then lowest latency, then name.
func less(a, b *entry) bool {
	if a.leases != b.leases {
		return a.leases < b.leases
	}
	if a.p.LatencyMillis != b.p.LatencyMillis {
		return a.p.LatencyMillis < b.p.LatencyMillis
	}
	return a.p.ID() < b.p.ID()
}

// view is the set of proxies matching one selector, kept ordered for selection. Views are
// made on first use and kept for the selectors crawlers actually use, so an acquire costs
// a tree lookup, not a scan of the fleet.
type view struct {
	sel      Selector
	key      string
	tree     *btree.BTreeG[*entry]
	matching int // proxies matching the selector
	healthy  int // of those, healthy
	full     int // of those, healthy but at maxLeases
	lastUsed uint64
}

type cooldownKey struct{ proxyID, target string }

type expiredLease struct {
	lease     *Lease
	keepUntil time.Time
}

// Store holds the index, the leases and the cooldowns, behind one lock.
type Store struct {
	mu  sync.Mutex
	now func() time.Time

	proxies map[string]*entry
	healthy int
	// byAttr is a posting list per attribute pair, used to build views quickly.
	byAttr map[string]map[string]map[*entry]struct{}
	views  map[string]*view
	tick   uint64

	leases  map[string]*Lease
	expired map[string]expiredLease
	// cooldowns are local ones from reports; durable ones come in Proxy.Cooldowns.
	cooldowns map[cooldownKey]time.Time
	// unresolved counts the proxies by CredentialsUnresolved reason, kept like healthy so
	// a metrics scrape does not scan the fleet.
	unresolved map[string]int
	// keepExpired is how long an expired lease still accepts a report.
	keepExpired time.Duration
	maxViews    int

	// loaded is set by the first ReplaceAll and never cleared. It is atomic, not under mu,
	// because the server checks it on every list and acquire: an extra acquisition of the
	// lock those requests already contend for would cost throughput for a flag that
	// changes once.
	loaded atomic.Bool
}

// NewStore returns an empty store. keepExpired is how long a report is still accepted for a
// lease after it expires (the cooldown window: a late report arrives exactly when the proxy
// is being rate-limited).
func NewStore(keepExpired time.Duration) *Store {
	return &Store{
		now:         time.Now,
		proxies:     map[string]*entry{},
		byAttr:      map[string]map[string]map[*entry]struct{}{},
		views:       map[string]*view{},
		leases:      map[string]*Lease{},
		expired:     map[string]expiredLease{},
		cooldowns:   map[cooldownKey]time.Time{},
		unresolved:  map[string]int{},
		keepExpired: keepExpired,
		maxViews:    1024,
	}
}

// SetClock replaces the clock (tests).
func (s *Store) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}

// Now is the store's clock, which lease expiries and cooldowns are measured against.
func (s *Store) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now()
}

// --- index ---------------------------------------------------------------------------

func (s *Store) detach(e *entry) {
	if !e.inTrees {
		return
	}
	for _, v := range e.views {
		v.tree.Delete(e)
	}
	e.inTrees = false
}

func (s *Store) attach(e *entry) {
	if e.inTrees || !e.available() {
		return
	}
	for _, v := range e.views {
		v.tree.ReplaceOrInsert(e)
	}
	e.inTrees = true
}

// count adds (sign = +1) or removes (-1) e from its views' counters.
func (s *Store) count(e *entry, sign int) {
	for _, v := range e.views {
		v.matching += sign
		if e.p.Healthy {
			v.healthy += sign
			if e.leases >= e.p.MaxLeases {
				v.full += sign
			}
		}
	}
}

func (s *Store) index(e *entry, add bool) {
	for k, v := range e.p.Attributes {
		if add {
			if s.byAttr[k] == nil {
				s.byAttr[k] = map[string]map[*entry]struct{}{}
			}
			if s.byAttr[k][v] == nil {
				s.byAttr[k][v] = map[*entry]struct{}{}
			}
			s.byAttr[k][v][e] = struct{}{}
			continue
		}
		delete(s.byAttr[k][v], e)
		if len(s.byAttr[k][v]) == 0 {
			delete(s.byAttr[k], v)
		}
	}
}

// Upsert adds or updates a proxy from the index source.
func (s *Store) Upsert(p Proxy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.upsertLocked(p)
}

func (s *Store) upsertLocked(p Proxy) {
	if p.MaxLeases <= 0 {
		p.MaxLeases = 1
	}
	if p.CredentialsUnresolved != "" {
		// Enforced here, not only where memos are decoded, so that no way into the index
		// can make a proxy leasable without the credentials it needs.
		p.Healthy = false
		p.Credentials = proxyauth.Credentials{}
	}
	e, ok := s.proxies[p.ID()]
	if ok {
		s.detach(e)
		s.count(e, -1)
		s.index(e, false)
		if e.p.Healthy {
			s.healthy--
		}
		s.countUnresolved(e.p, -1)
	} else {
		// A proxy can leave the index and come back (its workflow restarted, or a closed
		// run was listed after the running one) while crawlers still hold its leases.
		e = &entry{leases: s.held(p.ID())}
		s.proxies[p.ID()] = e
	}
	e.p = p
	if p.Healthy {
		s.healthy++
	}
	s.countUnresolved(p, +1)
	s.index(e, true)
	e.views = e.views[:0]
	for _, v := range s.views {
		if v.sel.Matches(p.Attributes) {
			e.views = append(e.views, v)
		}
	}
	s.count(e, +1)
	s.attach(e)
}

// held counts the live leases on a proxy. Only proxies new to the index pay for the scan.
func (s *Store) held(id string) int {
	n := 0
	for _, l := range s.leases {
		if l.ProxyID == id {
			n++
		}
	}
	return n
}

// Remove drops a proxy (its workflow ended). Its leases stay until released or expired.
func (s *Store) Remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeLocked(id)
}

func (s *Store) removeLocked(id string) {
	e, ok := s.proxies[id]
	if !ok {
		return
	}
	s.detach(e)
	s.count(e, -1)
	s.index(e, false)
	if e.p.Healthy {
		s.healthy--
	}
	s.countUnresolved(e.p, -1)
	delete(s.proxies, id)
}

func (s *Store) countUnresolved(p Proxy, sign int) {
	if p.CredentialsUnresolved == "" {
		return
	}
	s.unresolved[p.CredentialsUnresolved] += sign
	if s.unresolved[p.CredentialsUnresolved] == 0 {
		delete(s.unresolved, p.CredentialsUnresolved)
	}
}

// CredentialsUnresolved counts the proxies in the index whose credentials could not be
// resolved, by reason (Proxy.CredentialsUnresolved). Reasons with none are absent.
func (s *Store) CredentialsUnresolved() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.unresolved))
	for r, n := range s.unresolved {
		out[r] = n
	}
	return out
}

// ReplaceAll makes the index exactly ps (a full resync), and marks the index Loaded.
func (s *Store) ReplaceAll(ps []Proxy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := make(map[string]bool, len(ps))
	for _, p := range ps {
		keep[p.ID()] = true
		s.upsertLocked(p)
	}
	for id := range s.proxies {
		if !keep[id] {
			s.removeLocked(id)
		}
	}
	// Set last and under the lock: whoever sees it and then takes the lock sees the whole
	// fleet, never part of this pass.
	s.loaded.Store(true)
}

// Loaded reports whether the index has been loaded in full at least once (ReplaceAll ran).
// Until then an empty index says nothing about the fleet, so the server refuses to list or
// lease rather than answer "no proxies". Upsert alone does not count: incremental passes
// only see what changed, never the whole fleet. It stays true afterwards: a later failed
// refresh leaves the last full index in place, which is still worth serving.
func (s *Store) Loaded() bool { return s.loaded.Load() }

// Len is the number of proxies in the index.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.proxies)
}

// viewFor returns the view of sel, building it on first use.
func (s *Store) viewFor(sel Selector) *view {
	key := sel.Key()
	s.tick++
	if v, ok := s.views[key]; ok {
		v.lastUsed = s.tick
		return v
	}
	if len(s.views) >= s.maxViews {
		s.evictView()
	}
	v := &view{sel: sel, key: key, tree: btree.NewG(16, less), lastUsed: s.tick}
	s.views[key] = v
	for _, e := range s.candidates(sel) {
		if !sel.Matches(e.p.Attributes) {
			continue
		}
		e.views = append(e.views, v)
		v.matching++
		if e.p.Healthy {
			v.healthy++
			if e.leases >= e.p.MaxLeases {
				v.full++
			}
		}
		if e.inTrees {
			v.tree.ReplaceOrInsert(e)
		}
	}
	return v
}

// candidates is the smallest posting list among the selector's pairs (or every proxy).
func (s *Store) candidates(sel Selector) []*entry {
	var best map[*entry]struct{}
	for k, v := range sel {
		list := s.byAttr[k][v]
		if best == nil || len(list) < len(best) {
			best = list
		}
		if len(list) == 0 {
			return nil
		}
	}
	out := make([]*entry, 0, len(best))
	if best == nil {
		for _, e := range s.proxies {
			out = append(out, e)
		}
		return out
	}
	for e := range best {
		out = append(out, e)
	}
	return out
}

func (s *Store) evictView() {
	var oldest *view
	for _, v := range s.views {
		if oldest == nil || v.lastUsed < oldest.lastUsed {
			oldest = v
		}
	}
	delete(s.views, oldest.key)
	for _, e := range s.proxies {
		e.views = slices.DeleteFunc(e.views, func(v *view) bool { return v == oldest })
	}
}

// --- cooldowns -----------------------------------------------------------------------

func (s *Store) cooling(e *entry, target string, now time.Time) bool {
	id := e.p.ID()
	for _, t := range []string{target, ""} {
		if until, ok := s.cooldowns[cooldownKey{id, t}]; ok && until.After(now) {
			return true
		}
		if until, ok := e.p.Cooldowns[t]; ok && until.After(now) {
			return true
		}
		if target == "" {
			break
		}
	}
	return false
}

// Cooldown puts a proxy in cooldown for target ("" = every target) until the given time.
func (s *Store) Cooldown(proxyID, target string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := cooldownKey{proxyID, target}
	if until.After(s.cooldowns[k]) {
		s.cooldowns[k] = until
	}
}

// --- leases --------------------------------------------------------------------------

// Acquire leases the best proxy matching sel that is not cooling down for target.
func (s *Store) Acquire(sel Selector, target string, ttl time.Duration) (*Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	v := s.viewFor(sel)
	var pick *entry
	cooling := 0
	v.tree.Ascend(func(e *entry) bool {
		if s.cooling(e, target, now) {
			cooling++
			return true
		}
		pick = e
		return false
	})
	if pick == nil {
		return nil, &NoMatch{
			Considered: v.matching, Unhealthy: v.matching - v.healthy,
			AtCapacity: v.full, InCooldown: cooling,
		}
	}
	s.setLeases(pick, pick.leases+1)
	l := &Lease{ID: newID(), ProxyID: pick.p.ID(), Target: target, ExpiresAt: now.Add(ttl), Proxy: pick.p}
	s.leases[l.ID] = l
	return l, nil
}

// setLeases changes an entry's lease count, keeping trees and counters right.
func (s *Store) setLeases(e *entry, n int) {
	s.detach(e)
	s.count(e, -1)
	e.leases = n
	s.count(e, +1)
	s.attach(e)
}

// Release ends a lease. Releasing an unknown or already released lease is not an error.
func (s *Store) Release(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.leases[id]
	if !ok {
		return
	}
	s.endLocked(l)
	// A crawler often learns it was banned as it finishes: a report right after release
	// still counts, for the same window as after expiry.
	s.expired[id] = expiredLease{lease: l, keepUntil: s.now().Add(s.keepExpired)}
}

func (s *Store) endLocked(l *Lease) {
	delete(s.leases, l.ID)
	if e, ok := s.proxies[l.ProxyID]; ok && e.leases > 0 {
		s.setLeases(e, e.leases-1)
	}
}

// Renew extends a live lease to now+ttl.
func (s *Store) Renew(id string, ttl time.Duration) (*Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	l, ok := s.leases[id]
	if !ok {
		if _, gone := s.expired[id]; gone {
			return nil, ErrLeaseExpired
		}
		return nil, ErrUnknownLease
	}
	if !l.ExpiresAt.After(now) {
		s.expireLocked(l, now)
		return nil, ErrLeaseExpired
	}
	l.ExpiresAt = now.Add(ttl)
	if e, ok := s.proxies[l.ProxyID]; ok && e.p.CredentialsUnresolved == "" {
		// The lease is sticky to the proxy, not to an address: after a replacement the
		// renewal tells the crawler where the proxy is now, and the credentials it takes
		// now. While they cannot be resolved the renewal repeats the last ones the lease
		// was given: an answer without them would surely fail, and a proxy whose key was
		// merely rotated out of discovery's keyring still takes them.
		l.Proxy = e.p
	}
	cp := *l
	return &cp, nil
}

// Lookup returns a lease, live or expired within the report window.
func (s *Store) Lookup(id string) (*Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if l, ok := s.leases[id]; ok {
		if l.ExpiresAt.After(now) {
			cp := *l
			return &cp, nil
		}
		// Expired but not swept yet: the report window counts from its expiry.
		s.expireLocked(l, now)
	}
	if x, ok := s.expired[id]; ok && x.keepUntil.After(now) {
		cp := *x.lease
		return &cp, nil
	}
	return nil, ErrUnknownLease
}

func (s *Store) expireLocked(l *Lease, now time.Time) {
	s.endLocked(l)
	s.expired[l.ID] = expiredLease{lease: l, keepUntil: l.ExpiresAt.Add(s.keepExpired)}
}

// RunSweeper calls Sweep every interval until ctx ends.
func (s *Store) RunSweeper(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Sweep ends expired leases and forgets old cooldowns and expired leases. Correctness does
// not depend on it running often: renewals check expiry themselves, and a lease counted a
// second too long only makes selection a little conservative.
func (s *Store) Sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, l := range s.leases {
		if !l.ExpiresAt.After(now) {
			s.expireLocked(l, now)
		}
	}
	for id, x := range s.expired {
		if !x.keepUntil.After(now) {
			delete(s.expired, id)
		}
	}
	for k, until := range s.cooldowns {
		if !until.After(now) {
			delete(s.cooldowns, k)
		}
	}
}

// Stats are gauges for metrics.
type Stats struct {
	Proxies, Healthy, Leases, Cooldowns, Views int
}

// Stats counts what the store holds.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	// O(1): metrics scrape this under the lock acquires take, so it must not scan the fleet.
	return Stats{Proxies: len(s.proxies), Healthy: s.healthy, Leases: len(s.leases), Cooldowns: len(s.cooldowns), Views: len(s.views)}
}

// ProxyView is a proxy with its lease count, for listings.
type ProxyView struct {
	Proxy
	ActiveLeases int `json:"activeLeases"`
}

// List returns the proxies matching sel (and, if healthy is set, of that health), by ID.
func (s *Store) List(sel Selector, healthy *bool) []ProxyView {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []ProxyView{}
	for _, e := range s.candidates(sel) {
		if !sel.Matches(e.p.Attributes) || (healthy != nil && e.p.Healthy != *healthy) {
			continue
		}
		out = append(out, ProxyView{Proxy: e.p, ActiveLeases: e.leases})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID() < out[j].ID() })
	return out
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
