package discovery

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Demand: what crawlers ask of the proxies a selector describes, for whatever sizes them
// (a ProxyPool's autoscaler in the operator, or KEDA). A pool's proxies carry its
// template's attributes, so a request the pool could serve is one whose selector those
// attributes satisfy; the demand on a pool is then the leases held on its proxies, the
// requests waiting for one (the API's acquires with a wait and the gateway's), and the
// clients refused one lately.
//
// Discovery keeps no list of pools: it never talks to Kubernetes. A selector someone asks
// the demand of is watched for a while (watchFor): its demand is exported as metrics, and
// a gateway request that no proxy matches yet waits for it to grow (MayGrow) rather than
// being refused at once, as an acquire with a wait always does.

// Bounds of the demand book.
const (
	// RefusalWindow is how long a client refused a lease still counts as demand: a
	// crawler that does not wait retries, and may be refused again, within it.
	RefusalWindow = 30 * time.Second
	// maxRefusals bounds the refusals remembered (one per client and selector), and
	// maxRefusalsPerClient one client's share, so that no client's retry loop pushes the
	// others' refusals out.
	maxRefusals          = 4096
	maxRefusalsPerClient = 64
	// watchFor is how long a selector stays watched after its demand was last asked:
	// several of an autoscaler's periods, so a slow one does not drop out between looks.
	watchFor = 10 * time.Minute
	// maxWatched bounds the selectors watched, and so the demand metrics' series. When it
	// is full, the selector watched the shortest while makes room: pools an autoscaler has
	// asked about for hours are not pushed out by a burst of new selectors.
	maxWatched = 1024
)

// Demand is the demand on the proxies a selector describes, as GET /v1/demand answers it.
type Demand struct {
	// Selector is the attributes asked about: a pool's template attributes.
	Selector Selector `json:"selector"`
	// Proxies match the selector; Healthy of them can take leases.
	Proxies int `json:"proxies"`
	Healthy int `json:"healthy"`
	// Capacity is the healthy proxies' maxLeases summed.
	Capacity int `json:"capacity"`
	// Held is the live leases on matching proxies; LeasedProxies counts those with one.
	Held          int `json:"held"`
	LeasedProxies int `json:"leasedProxies"`
	// Waiting counts the requests waiting for a proxy these could serve.
	Waiting int `json:"waiting"`
	// Refused counts the clients refused such a proxy within RefusalWindow (one each per
	// replica however often they retried).
	Refused int `json:"refused"`
	// Demand is Held + Waiting + Refused: the leases crawlers want of these proxies.
	Demand int `json:"demand"`
	// Replicas is how many discovery replicas' waiting and refused requests are counted;
	// Partial says some replica did not answer, so Waiting and Refused may be short.
	Replicas int  `json:"replicas"`
	Partial  bool `json:"partial,omitempty"`
}

// DemandPart is what only one replica knows of a selector's demand: the requests waiting
// on it and the clients it refused. Leases are copied to every replica; these are not.
type DemandPart struct {
	Waiting int `json:"waiting"`
	Refused int `json:"refused"`
}

// Add counts a replica's part in d.
func (d *Demand) Add(p DemandPart) {
	d.Waiting += p.Waiting
	d.Refused += p.Refused
	d.Replicas++
	d.Demand = d.Held + d.Waiting + d.Refused
}

// demandBook is what the server keeps for demand: recent refusals and the selectors
// watched. It has its own lock: a refusal is noted after the store's is released.
type demandBook struct {
	mu       sync.Mutex
	refusals *lru[string, refusal]
	// perClient counts each client's refusals in refusals.
	perClient map[string]int
	// held is len(refusals), read without the lock by grants, which forget a refusal
	// only when there may be one.
	held    atomic.Int64
	watched map[string]watched
}

type refusal struct {
	client string
	want   Selector
	at     time.Time
}

type watched struct {
	sel Selector
	// since is when the selector was first asked; until is when it stops being watched.
	since, until time.Time
}

func refusalKey(w Want) string { return w.Client + "\x00" + w.Selector.Key() }

// noteRefusal remembers that w's client was refused a lease no proxy could take (a
// NoMatch), when the proxies it asked for may grow (MayGrow): demand for a pool. Refusals
// for what nothing sizes are nobody's demand and are not kept.
func (s *Server) noteRefusal(w Want, err error) {
	if NoMatchOf(err) == nil || !s.MayGrow(w.Selector) {
		return
	}
	b := &s.demand
	now := s.store.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.refusals == nil {
		b.refusals, b.perClient = newLRU[string, refusal](), map[string]int{}
	}
	b.pruneLocked(now.Add(-RefusalWindow))
	defer b.countLocked()
	key := refusalKey(w)
	if _, ok := b.refusals.get(key); !ok {
		if b.perClient[w.Client] >= maxRefusalsPerClient {
			return
		}
		b.perClient[w.Client]++
	}
	b.refusals.put(key, refusal{client: w.Client, want: w.Selector, at: now})
	for b.refusals.len() > maxRefusals {
		b.removeLocked(b.refusals.oldest())
	}
}

// NoteRefusal is noteRefusal for the gateway's refusals that did not wait.
func (s *Server) NoteRefusal(w Want, err error) { s.noteRefusal(w, err) }

// forgetRefusal drops w's client's refusal for w's selector: it is served now, or waits,
// and counts as held or waiting instead.
func (s *Server) forgetRefusal(w Want) {
	b := &s.demand
	if b.held.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	// Refusals past the window go here too: once nobody is refused any more, the first
	// grant after the window empties the book and later grants skip its lock.
	b.pruneLocked(s.store.Now().Add(-RefusalWindow))
	if it, ok := b.refusals.get(refusalKey(w)); ok {
		b.removeLocked(it)
	}
	b.countLocked()
}

// pruneLocked drops the refusals older than cutoff: the least recently refused are last.
func (b *demandBook) pruneLocked(cutoff time.Time) {
	for it := b.refusals.oldest(); it != nil && !it.val.at.After(cutoff); it = b.refusals.oldest() {
		b.removeLocked(it)
	}
}

// countLocked publishes how many refusals the book holds to the grants that read held
// without the lock; every path that changes the book ends here.
func (b *demandBook) countLocked() { b.held.Store(int64(b.refusals.len())) }

func (b *demandBook) removeLocked(it *lruItem[string, refusal]) {
	if b.perClient[it.val.client]--; b.perClient[it.val.client] <= 0 {
		delete(b.perClient, it.val.client)
	}
	b.refusals.remove(it)
}

// DemandPart is this replica's own part of sel's demand; asking watches sel.
func (s *Server) DemandPart(sel Selector) DemandPart {
	s.watch(sel)
	return s.localDemand(sel)
}

func (s *Server) localDemand(sel Selector) DemandPart {
	return DemandPart{Waiting: s.waiters.waitingFor(sel), Refused: servedBy(s.refusedWants(), sel)}
}

// refusedWants counts the refusals within RefusalWindow by the selector refused.
func (s *Server) refusedWants() map[string]*wantCount {
	out := map[string]*wantCount{}
	cutoff := s.store.Now().Add(-RefusalWindow)
	b := &s.demand
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.refusals == nil {
		return out
	}
	b.pruneLocked(cutoff)
	b.countLocked()
	// Newest first: the first one too old ends the count.
	for it := b.refusals.head; it != nil && it.val.at.After(cutoff); it = it.next {
		key := it.val.want.Key()
		if c := out[key]; c != nil {
			c.n++
			continue
		}
		out[key] = &wantCount{want: it.val.want, n: 1}
	}
	return out
}

// Demand is sel's demand as this replica sees it: every lease (copies included) and its
// own waiting and refused requests; a replica set adds the others' parts (Demand.Add).
// Asking watches sel.
func (s *Server) Demand(sel Selector) Demand {
	d := Demand{Selector: sel}
	s.store.supply(sel, &d)
	d.Add(s.DemandPart(sel))
	return d
}

// supply counts what the proxies matching sel offer and hold.
func (s *Store) supply(sel Selector, d *Demand) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.viewFor(sel)
	d.Proxies, d.Healthy, d.Capacity = v.matching, v.healthy, v.capacity
	d.Held, d.LeasedProxies = v.leases, v.leased
}

// watch keeps sel watched for watchFor from now. When the book is full, one that has ended
// or else the selector watched the shortest while (first asked last) makes room.
func (s *Server) watch(sel Selector) {
	now := s.store.Now()
	b := &s.demand
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.watched == nil {
		b.watched = map[string]watched{}
	}
	key := sel.Key()
	w, ok := b.watched[key]
	if !ok {
		if len(b.watched) >= maxWatched {
			newest := ""
			for k, x := range b.watched {
				if !x.until.After(now) {
					newest = k // ended already: room at no one's cost
					break
				}
				if newest == "" || x.since.After(b.watched[newest].since) {
					newest = k
				}
			}
			delete(b.watched, newest)
		}
		w = watched{sel: sel, since: now}
	}
	w.until = now.Add(watchFor)
	b.watched[key] = w
}

// watchedNow are the selectors watched now.
func (s *Server) watchedNow() []Selector {
	b := &s.demand
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.watched) == 0 {
		// Nothing to read the clock for: a scrape of a discovery nobody sizes by demand
		// touches nothing of the store's.
		return nil
	}
	now := s.store.Now()
	var out []Selector
	for k, w := range b.watched {
		if !w.until.After(now) {
			delete(b.watched, k)
			continue
		}
		out = append(out, w.sel)
	}
	return out
}

// MayGrow says whether the proxies a request for want asks for may grow: a watched
// selector (someone sizes those proxies by their demand) satisfies want. A request no
// proxy can take is then worth waiting for, even when none matches yet.
func (s *Server) MayGrow(want Selector) bool {
	for _, sel := range s.watchedNow() {
		if want.Matches(sel) {
			return true
		}
	}
	return false
}

// demandCollector exports the demand of the watched selectors. Held and capacity are
// every replica's (leases are copied to all): take their max over replicas; waiting and
// refused are this replica's own: sum them.
type demandCollector struct {
	s                *Server
	leases, capacity *prometheus.Desc
}

func newDemandCollector(s *Server) demandCollector {
	return demandCollector{s: s,
		leases: prometheus.NewDesc("proxyfleet_discovery_demand_leases",
			"Leases wanted of the proxies a watched selector (a pool's attributes) describes, by kind: held (on every replica alike: take the max), waiting and refused (this replica's own: sum them).",
			[]string{"selector", "kind"}, nil),
		capacity: prometheus.NewDesc("proxyfleet_discovery_demand_capacity_leases",
			"Leases the healthy proxies a watched selector describes can take (maxLeases summed; every replica alike).",
			[]string{"selector"}, nil),
	}
}

func (c demandCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.leases
	ch <- c.capacity
}

// Collect reads the waiters and the refusals once, by the selector they want, and matches
// each watched selector against those outside every lock: a scrape holds the queue's lock
// (which the store's wakes take) only to copy it.
func (c demandCollector) Collect(ch chan<- prometheus.Metric) {
	watched := c.s.watchedNow()
	if len(watched) == 0 {
		return
	}
	waiting, refused := c.s.waiters.wants(), c.s.refusedWants()
	for _, sel := range watched {
		d := Demand{Selector: sel}
		c.s.store.supply(sel, &d)
		key := sel.Key()
		ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, float64(d.Held), key, "held")
		ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, float64(servedBy(waiting, sel)), key, "waiting")
		ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, float64(servedBy(refused, sel)), key, "refused")
		ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(d.Capacity), key)
	}
}
