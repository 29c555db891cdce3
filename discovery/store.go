package discovery

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"maps"
	"math/rand/v2"
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
	// Instance is a Managed proxy's current instance, when the memo names it: a lease
	// renewed across a replacement must not silently move to the new instance, whose
	// egress address differs even if the proxy's address does not.
	Instance string `json:"-"`
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
}

// ID is namespace/name, unique in the fleet.
func (p *Proxy) ID() string { return p.Namespace + "/" + p.Name }

// Lease is a proxy handed to a crawler until ExpiresAt. The store hands out copies.
type Lease struct {
	ID      string `json:"leaseID"`
	ProxyID string `json:"-"`
	Target  string `json:"target,omitempty"`
	// Session is the crawler's sticky session, if it asked for one.
	Session   string    `json:"session,omitempty"`
	ExpiresAt time.Time `json:"expiresAt"`
	// Proxy is the proxy as it was when the lease was granted or last renewed.
	Proxy Proxy `json:"-"`
}

// NoMatch explains why no proxy was offered. The numbers add up: every proxy matching the
// selector is counted in exactly one of Unhealthy, AtCapacity or InCooldown.
type NoMatch struct {
	Considered int `json:"considered"`
	AtCapacity int `json:"atCapacity"`
	InCooldown int `json:"inCooldown"`
	Unhealthy  int `json:"unhealthy"`
	// RetryAfter is when the first matching proxy frees up by itself: the earliest end of
	// a lease on a proxy at capacity or of a cooldown. Zero when none will (every match is
	// unhealthy, or nothing matches): waiting alone would not help.
	RetryAfter time.Duration `json:"-"`
}

func (n *NoMatch) Error() string { return "no proxy matches" }

// ProxyGone says a lease's proxy can no longer serve it: the lease has ended, and the
// crawler must acquire another. Reason is one of the ProxyGone* constants.
type ProxyGone struct{ Reason string }

// Reasons of ProxyGone.
const (
	// ProxyGoneReplaced: the proxy has a new address (its instance was replaced), so the
	// crawler's traffic would leave from another IP than the one its session started on.
	ProxyGoneReplaced = "replaced"
	// ProxyGoneUnhealthy: the proxy failed its health checks.
	ProxyGoneUnhealthy = "unhealthy"
	// ProxyGoneRemoved: the proxy left the fleet (its Proxy was deleted).
	ProxyGoneRemoved = "removed"
)

func (e *ProxyGone) Error() string { return "the lease's proxy is gone: " + e.Reason }

// Errors of lease operations.
var (
	ErrUnknownLease = errors.New("unknown lease")
	ErrLeaseExpired = errors.New("lease expired")
	// ErrReportLimit: the lease has reported as many cooldowns as one lease may.
	ErrReportLimit = errors.New("report limit reached")
	// ErrProxyUnavailable: Grant was asked for a proxy that cannot take the lease now.
	ErrProxyUnavailable = errors.New("proxy cannot take the lease now")
)

// entry is a proxy with its leases. It sits in the trees of every view it matches while it
// can take a lease (healthy and under maxLeases).
type entry struct {
	// p is replaced whole, never changed in place: leases share it as their snapshot.
	p  *Proxy
	id string
	// probeHealthy is the health the proxy's checks gave, before the store overrode it for
	// unresolved credentials: a renewal keeps a lease whose proxy still works.
	probeHealthy bool
	// held are the live leases on the proxy.
	held []*lease
	// lastUsed is the store's grant sequence number at the proxy's last lease; rank, drawn
	// at random once, breaks ties. Ordering by them walks the fleet: the proxy leased
	// longest ago comes first, and replicas or restarts do not all walk in one order.
	lastUsed, rank uint64
	// ring is the proxy's place on the session ring, a hash of its ID, the same in every
	// process.
	ring  uint64
	views []*view
	// inTrees is true while the entry is in its views' rotation trees, onRing while it is
	// on their session rings. They differ only inside a change (see syncRing).
	inTrees, onRing bool
}

func (e *entry) leaseCount() int { return len(e.held) }

func (e *entry) available() bool { return e.p.Healthy && e.leaseCount() < e.p.MaxLeases }

// less orders candidates: fewest leases, then leased longest ago, then at random.
func less(a, b *entry) bool {
	if a.leaseCount() != b.leaseCount() {
		return a.leaseCount() < b.leaseCount()
	}
	if a.lastUsed != b.lastUsed {
		return a.lastUsed < b.lastUsed
	}
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.id < b.id
}

// ringLess orders the session ring.
func ringLess(a, b *entry) bool {
	if a.ring != b.ring {
		return a.ring < b.ring
	}
	return a.id < b.id
}

// ringHash places an ID or a session on the session ring. It must be the same in every
// process and every release, so it is a fixed cryptographic hash, not maphash.
func ringHash(s string) uint64 {
	sum := sha256.Sum256([]byte(s))
	return binary.BigEndian.Uint64(sum[:8])
}

// view is the set of proxies matching one selector, kept ordered for selection. Views are
// made on first use and kept for the selectors crawlers actually use, so an acquire costs
// a tree lookup, not a scan of the fleet.
type view struct {
	sel      Selector
	key      string
	tree     *btree.BTreeG[*entry]
	ring     *btree.BTreeG[*entry]
	matching int // proxies matching the selector
	healthy  int // of those, healthy
	full     int // of those, healthy but at maxLeases
	// leases are the live leases on the matching proxies (every replica's); leased counts
	// the proxies with at least one; capacity is the healthy ones' maxLeases summed. They
	// are what a pool's demand is weighed against (Server.Demand), kept here so that
	// reading them costs nothing however large the fleet.
	leases, leased, capacity int
	lastUsed                 uint64
}

// StoreConfig bounds what the store keeps. Everything a crawler can make it remember is
// capped, least recently used out, so that traffic cannot grow discovery's memory.
type StoreConfig struct {
	// KeepEnded is how long a lease still takes reports after it is released or expires:
	// the longest cooldown a report can start (a late report arrives exactly when the proxy
	// is being rate-limited).
	KeepEnded time.Duration
	// MaxEnded caps the ended leases kept for reports (default 65,536).
	MaxEnded int
	// MaxCooldowns caps the cooldowns from reports, in total (default 65,536) and per proxy
	// (MaxCooldownsPerProxy, default 256).
	MaxCooldowns, MaxCooldownsPerProxy int
	// MaxReportsPerLease caps the cooldowns one lease may report (default 64); more are
	// refused, so one lease cannot flood the proxy's workflow with signals.
	MaxReportsPerLease int
	// MaxSessions caps the sticky sessions remembered (default 65,536); SessionIdle is how
	// long an unused one is kept (default 1h). A forgotten session is placed again by
	// hashing, which most often gives the same proxy.
	MaxSessions int
	SessionIdle time.Duration
	// Replica is this process's number among discovery's replicas (0 when it runs
	// alone): the first byte of every lease ID it grants, so that any replica knows
	// which one owns a lease.
	Replica byte
}

// Defaults of StoreConfig.
const (
	DefaultMaxEnded             = 65536
	DefaultMaxCooldowns         = 65536
	DefaultMaxCooldownsPerProxy = 256
	DefaultMaxReportsPerLease   = 64
	DefaultMaxSessions          = 65536
	DefaultSessionIdle          = time.Hour
)

func (c *StoreConfig) defaults() {
	orDefaultInt(&c.MaxEnded, DefaultMaxEnded)
	orDefaultInt(&c.MaxCooldowns, DefaultMaxCooldowns)
	orDefaultInt(&c.MaxCooldownsPerProxy, DefaultMaxCooldownsPerProxy)
	orDefaultInt(&c.MaxReportsPerLease, DefaultMaxReportsPerLease)
	orDefaultInt(&c.MaxSessions, DefaultMaxSessions)
	orDefault(&c.SessionIdle, DefaultSessionIdle)
}

func orDefaultInt(n *int, def int) {
	if *n <= 0 {
		*n = def
	}
}

// Store holds the index, the leases and the cooldowns, behind one lock.
type Store struct {
	mu  sync.Mutex
	now func() time.Time
	cfg StoreConfig

	proxies map[string]*entry
	healthy int
	// byAttr is a posting list per attribute pair, used to build views quickly.
	byAttr map[string]map[string]map[*entry]struct{}
	views  map[string]*view
	tick   uint64
	// grants numbers the leases granted, for entry.lastUsed.
	grants uint64
	// freed counts the changes that may let a refused grant through: a lease that ended
	// (released, expired, or a peer's copy ended) and a proxy that came, turned healthy,
	// took more leases or changed attributes. A request waiting for a slot looks again
	// when it moved, not on every tick of its clock: waiting costs the store nothing while
	// nothing changes, however many wait.
	freed atomic.Uint64
	// onFreed are called, under mu, each time freed moves: the acquires waiting for a slot
	// look again then (Server.GrantWaiting), one at a time. Each must be quick and must not
	// take mu.
	onFreed []func()
	// picks counts the looks for a proxy to lease (every grant tried, and every pick in a
	// replica set): what acquiring, and waiting to, costs the store.
	picks atomic.Uint64

	leases map[leaseKey]*lease
	// byClient counts the live leases by client name.
	byClient map[string]int
	// ended are released or expired leases, kept for reports, oldest first out.
	ended *lru[leaseKey, *lease]
	// cooldowns are local ones from reports; durable ones come in Proxy.Cooldowns.
	cooldowns *cooldowns
	sessions  *lru[string, session]
	// unresolved counts the proxies by CredentialsUnresolved reason, kept like healthy so
	// a metrics scrape does not scan the fleet.
	unresolved map[string]int
	maxViews   int
	// rankOf draws entry.rank; tests make it follow the ID, to know the order.
	rankOf func(id string) uint64

	// loaded is set by the first ReplaceAll and never cleared. It is atomic, not under mu,
	// because the server checks it on every list and acquire: an extra acquisition of the
	// lock those requests already contend for would cost throughput for a flag that
	// changes once.
	loaded atomic.Bool
}

// NewStore returns an empty store that keeps ended leases for reports for keepEnded, with
// the other bounds at their defaults.
func NewStore(keepEnded time.Duration) *Store {
	return NewStoreWith(StoreConfig{KeepEnded: keepEnded})
}

// NewStoreWith returns an empty store bounded by cfg.
func NewStoreWith(cfg StoreConfig) *Store {
	cfg.defaults()
	return &Store{
		now:        time.Now,
		cfg:        cfg,
		proxies:    map[string]*entry{},
		byAttr:     map[string]map[string]map[*entry]struct{}{},
		views:      map[string]*view{},
		leases:     map[leaseKey]*lease{},
		byClient:   map[string]int{},
		ended:      newLRU[leaseKey, *lease](),
		cooldowns:  newCooldowns(cfg.MaxCooldowns, cfg.MaxCooldownsPerProxy),
		sessions:   newLRU[string, session](),
		unresolved: map[string]int{},
		maxViews:   1024,
		rankOf:     func(string) uint64 { return rand.Uint64() },
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
	if !e.inTrees && e.available() {
		for _, v := range e.views {
			v.tree.ReplaceOrInsert(e)
		}
		e.inTrees = true
	}
	s.syncRing(e)
}

// syncRing puts e on its views' session rings while it is in their trees, and takes it
// off otherwise. A ring's order does not depend on lease counts, so unlike the rotation
// tree it changes only when the proxy starts or stops taking leases: a lease that leaves
// the proxy available does not touch it.
func (s *Store) syncRing(e *entry) {
	if e.onRing == e.inTrees {
		return
	}
	for _, v := range e.views {
		if e.inTrees {
			v.ring.ReplaceOrInsert(e)
		} else {
			v.ring.Delete(e)
		}
	}
	e.onRing = e.inTrees
}

// count adds (sign = +1) or removes (-1) e from its views' counters.
func (s *Store) count(e *entry, sign int) {
	for _, v := range e.views {
		v.count(e, sign)
	}
}

// count adds (sign = +1) or removes (-1) e from the view's counters.
func (v *view) count(e *entry, sign int) {
	v.matching += sign
	if n := e.leaseCount(); n > 0 {
		v.leases += sign * n
		v.leased += sign
	}
	if e.p.Healthy {
		v.healthy += sign
		v.capacity += sign * e.p.MaxLeases
		if e.leaseCount() >= e.p.MaxLeases {
			v.full += sign
		}
	}
}

// changeLeases runs change, which alters e's leases, keeping e's place in its views'
// trees and their counters right.
func (s *Store) changeLeases(e *entry, change func()) {
	s.detach(e)
	s.count(e, -1)
	change()
	s.count(e, +1)
	s.attach(e)
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
	probeHealthy := p.Healthy
	if p.CredentialsUnresolved != "" {
		// Enforced here, not only where memos are decoded, so that no way into the index
		// can make a proxy leasable without the credentials it needs.
		p.Healthy = false
		p.Credentials = proxyauth.Credentials{}
	}
	id := p.ID()
	e, ok := s.proxies[id]
	if !ok || (p.Healthy && !e.p.Healthy) || p.MaxLeases > e.p.MaxLeases || !maps.Equal(p.Attributes, e.p.Attributes) {
		s.markFreedLocked()
	}
	if ok {
		s.detach(e)
		s.syncRing(e) // off the rings of the views it is in now; attach puts it back
		s.count(e, -1)
		s.index(e, false)
		if e.p.Healthy {
			s.healthy--
		}
		s.countUnresolved(e.p, -1)
	} else {
		// A proxy can leave the index and come back (its workflow restarted, or a closed
		// run was listed after the running one) while crawlers still hold its leases.
		e = &entry{id: id, ring: ringHash(id), rank: s.rankOf(id)}
		s.proxies[id] = e
		s.adoptLeases(e)
	}
	e.p = &p
	e.probeHealthy = probeHealthy
	if p.Healthy {
		s.healthy++
	}
	s.countUnresolved(e.p, +1)
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

// adoptLeases gives a proxy new to the index the live leases crawlers still hold on it: a
// proxy can leave the index and come back (its workflow restarted, or a closed run was
// listed after the running one). Only proxies new to the index pay for the scan.
func (s *Store) adoptLeases(e *entry) {
	for _, l := range s.leases {
		if l.proxyID == e.id {
			e.held = append(e.held, l)
		}
	}
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
	s.syncRing(e)
	s.count(e, -1)
	s.index(e, false)
	if e.p.Healthy {
		s.healthy--
	}
	s.countUnresolved(e.p, -1)
	delete(s.proxies, id)
}

func (s *Store) countUnresolved(p *Proxy, sign int) {
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

// Freed counts the changes that may let a grant refused before through (see Store.freed):
// while it stands still, a grant refused for want of a slot is refused again.
func (s *Store) Freed() uint64 { return s.freed.Load() }

// Picks counts the looks for a proxy to lease so far: every grant the store tried, and
// every pick of a replica set's acquire. A waiting acquire that looks only when something
// changed leaves it still while nothing does.
func (s *Store) Picks() uint64 { return s.picks.Load() }

// markFreedLocked counts a change that may let a refused grant through, and tells those
// waiting for one (onFreed).
func (s *Store) markFreedLocked() {
	s.freed.Add(1)
	for _, f := range s.onFreed {
		f()
	}
}

// notifyFreed has f called each time the store counts a change that may free a slot
// (Freed moves), under the store's lock: f must be quick and must not call the store.
func (s *Store) notifyFreed(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onFreed = append(s.onFreed, f)
}

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
	v := &view{sel: sel, key: key, tree: btree.NewG(16, less), ring: btree.NewG(16, ringLess), lastUsed: s.tick}
	s.views[key] = v
	s.forMatching(sel, func(e *entry) {
		e.views = append(e.views, v)
		v.count(e, +1)
		if e.inTrees {
			v.tree.ReplaceOrInsert(e)
			v.ring.ReplaceOrInsert(e)
		}
	})
	return v
}

// forMatching calls fn for every proxy matching sel, walking the smallest posting list
// among the selector's pairs rather than the whole fleet.
func (s *Store) forMatching(sel Selector, fn func(*entry)) {
	var best map[*entry]struct{}
	for k, v := range sel {
		list := s.byAttr[k][v]
		if len(list) == 0 {
			return
		}
		if best == nil || len(list) < len(best) {
			best = list
		}
	}
	if best == nil {
		for _, e := range s.proxies {
			fn(e)
		}
		return
	}
	for e := range best {
		if sel.Matches(e.p.Attributes) {
			fn(e)
		}
	}
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

// Stats are gauges for metrics.
type Stats struct {
	Proxies, Healthy, Leases, Cooldowns, Views, Sessions, Ended int
}

// clientLeases counts the live leases of each client (by name; "" is leases granted
// without client names).
func (s *Store) clientLeases() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.byClient)
}

// Stats counts what the store holds.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	// O(1): metrics scrape this under the lock acquires take, so it must not scan the fleet.
	return Stats{Proxies: len(s.proxies), Healthy: s.healthy, Leases: len(s.leases),
		Cooldowns: s.cooldowns.len(), Views: len(s.views), Sessions: s.sessions.len(), Ended: s.ended.len()}
}

// ProxyView is a proxy with its lease count, for listings.
type ProxyView struct {
	Proxy
	ActiveLeases int `json:"activeLeases"`
	// Resting are the proxy's cooldowns in force, by target ("" for every target): from
	// reports here and from its workflow, the later end of the two.
	Resting map[string]time.Time `json:"resting,omitempty"`
}

// List returns the proxies matching sel (and, if healthy is set, of that health), by ID.
func (s *Store) List(sel Selector, healthy *bool) []ProxyView {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []ProxyView{}
	now := s.now()
	s.forMatching(sel, func(e *entry) {
		if healthy == nil || e.p.Healthy == *healthy {
			v := ProxyView{Proxy: *e.p, ActiveLeases: e.leaseCount()}
			rest := func(target string, until time.Time) {
				if until.After(now) && until.After(v.Resting[target]) {
					if v.Resting == nil {
						v.Resting = map[string]time.Time{}
					}
					v.Resting[target] = until
				}
			}
			for target, until := range e.p.Cooldowns {
				rest(target, until)
			}
			for target, it := range s.cooldowns.byProxy[e.id] {
				rest(target, it.val)
			}
			out = append(out, v)
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID() < out[j].ID() })
	return out
}
