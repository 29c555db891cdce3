package discovery

import (
	"strings"
	"time"
)

// LeaseRecord is a lease as replicas copy it to each other: everything the lease table
// needs to count the lease against its proxy, renew it, end it and take reports for it,
// and nothing secret. The proxy's credentials are not in it: a replica that takes a lease
// over resolves them from its own index, where the proxy's address and instance still
// match.
type LeaseRecord struct {
	ID      string `json:"id"`
	Version uint64 `json:"version"`
	ProxyID string `json:"proxyID"`
	// IP, Port and Instance are the proxy as the lease was granted or last renewed: a
	// proxy that no longer has them was replaced under the lease.
	IP       string `json:"ip"`
	Port     int32  `json:"port"`
	Instance string `json:"instance,omitempty"`
	Target   string `json:"target,omitempty"`
	// Session is the lease's sticky session, live or ended: a report by session names
	// the session's latest lease. SessionAt is when the session last pointed at this
	// lease (its grant or latest renewal, on the owner's clock).
	Session   string    `json:"session,omitempty"`
	SessionAt time.Time `json:"sessionAt,omitzero"`
	Client    string    `json:"client,omitempty"`
	Expires   time.Time `json:"expires"`
	Reports   int       `json:"reports,omitempty"`
	// Ended is set once the lease was released or its proxy gone (Gone says why); it
	// takes reports until KeepUntil.
	Ended     bool      `json:"ended,omitempty"`
	KeepUntil time.Time `json:"keepUntil,omitzero"`
	Gone      string    `json:"gone,omitempty"`
}

func (l *lease) record() LeaseRecord {
	return LeaseRecord{ID: l.key.String(), Version: l.version, ProxyID: l.proxyID, IP: l.proxy.IP, Port: l.proxy.Port,
		Instance: l.proxy.Instance, Target: l.target, Session: l.session, SessionAt: l.sessionAt, Client: l.client,
		Expires: l.expires, Reports: l.reports, Ended: !l.keepUntil.IsZero(), KeepUntil: l.keepUntil, Gone: l.gone}
}

// Record is the lease with this ID as replicas copy it, live or ended within its report
// window.
func (s *Store) Record(id string) (LeaseRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key, ok := parseLeaseID(id)
	if !ok {
		return LeaseRecord{}, false
	}
	if l, ok := s.leases[key]; ok {
		return l.record(), true
	}
	if it, ok := s.ended.get(key); ok {
		return it.val.record(), true
	}
	return LeaseRecord{}, false
}

// Snapshot is what a replica sends one that starts: every live lease (so that it counts
// them all when it picks), the ended ones owned by that replica (so that its leases still
// take their late reports) and the ended ones of a session (so that it knows the session's
// latest lease, which a report by session names, as its peers do).
func (s *Store) Snapshot(owner int) []LeaseRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]LeaseRecord, 0, len(s.leases))
	for _, l := range s.leases {
		out = append(out, l.record())
	}
	for it := s.ended.oldest(); it != nil; it = it.prev {
		if int(it.key[0]) == owner || it.val.session != "" {
			out = append(out, it.val.record())
		}
	}
	return out
}

// Owned is every lease this replica owns, live or ended within its report window: what
// it sends a peer that missed some of its changes (discovery/peer).
func (s *Store) Owned() []LeaseRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []LeaseRecord
	for _, l := range s.leases {
		if l.key[0] == s.cfg.Replica {
			out = append(out, l.record())
		}
	}
	for it := s.ended.oldest(); it != nil; it = it.prev {
		if it.key[0] == s.cfg.Replica {
			out = append(out, it.val.record())
		}
	}
	return out
}

// Apply takes in leases copied from their owners. A copy older than the one held (a lower
// version: copies can arrive out of order, and a snapshot can cross newer changes) is
// ignored, so applying the same records twice, or in any order, ends the same.
func (s *Store) Apply(recs []LeaseRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, r := range recs {
		key, ok := parseLeaseID(r.ID)
		if !ok {
			continue
		}
		l, live := s.leases[key]
		var endedItem *lruItem[leaseKey, *lease]
		if !live {
			if it, ok := s.ended.get(key); ok {
				endedItem, l = it, it.val
			}
		}
		if l != nil && l.version >= r.Version {
			continue
		}
		keepUntil := r.KeepUntil
		if !r.Ended && !r.Expires.After(now) {
			keepUntil = r.Expires.Add(s.cfg.KeepEnded)
		}
		wantLive := keepUntil.IsZero()
		if !wantLive && !keepUntil.After(now) {
			continue // past its report window: nothing to keep
		}
		if l == nil {
			l = &lease{key: key}
		}
		l.proxyID, l.target, l.session, l.expires, l.reports, l.gone = r.ProxyID, r.Target, r.Session, r.Expires, r.Reports, r.Gone
		if !live {
			l.client = r.Client // a live lease is counted under its client: it never changes
		}
		l.proxy = s.proxyAsRecorded(r)
		switch {
		case wantLive && !live:
			if endedItem != nil {
				s.ended.remove(endedItem)
			}
			l.keepUntil = time.Time{}
			s.addLive(l)
			if e := s.proxies[l.proxyID]; e != nil {
				s.changeLeases(e, func() {
					e.held = append(e.held, l)
					if endedItem == nil {
						// A new lease moves its proxy to the back of the rotation here
						// too, as a grant of this replica's own would: otherwise every
						// replica hands out the proxies that others just leased first.
						s.grants++
						e.lastUsed = s.grants
					}
				})
			}
		case wantLive:
		case live:
			s.endLocked(l, keepUntil)
		case endedItem != nil:
			l.keepUntil = keepUntil
		default:
			l.keepUntil = keepUntil
			s.ended.put(key, l)
			for s.ended.len() > s.cfg.MaxEnded {
				s.ended.remove(s.ended.oldest())
			}
		}
		l.version = r.Version
		if l.session != "" {
			// A grant or renewal keeps its session known here too, not only on its
			// owner, and so does an ended lease restored after a restart.
			at := r.SessionAt
			if at.IsZero() && wantLive {
				at = now // a copy from a replica older than SessionAt
			}
			s.adoptSession(l, at, now)
		}
	}
}

// adoptSession makes a copied lease its session's latest, as of at, unless this replica
// knows a later one (copies arrive in any order) or the session has been idle too long.
func (s *Store) adoptSession(l *lease, at, now time.Time) {
	if at.IsZero() || now.Sub(at) >= s.cfg.SessionIdle {
		return
	}
	name := sessionKey(l.client, l.session)
	if it, ok := s.sessions.get(name); ok && it.val.lastUsed.After(at) {
		return
	}
	l.sessionAt = at
	s.sessions.put(name, session{proxyID: l.proxyID, lease: l.key, lastUsed: at})
	for s.sessions.len() > s.cfg.MaxSessions {
		s.sessions.remove(s.sessions.oldest())
	}
}

// proxyAsRecorded is the proxy a copied lease was granted on: the index's own snapshot
// when the proxy still has the recorded address and instance (it carries the credentials
// a renewal answers with), or else a bare one that a renewal finds replaced.
func (s *Store) proxyAsRecorded(r LeaseRecord) *Proxy {
	if e := s.proxies[r.ProxyID]; e != nil && e.p.IP == r.IP && e.p.Port == r.Port && e.p.Instance == r.Instance {
		return e.p
	}
	ns, name, _ := strings.Cut(r.ProxyID, "/")
	return &Proxy{Namespace: ns, Name: name, IP: r.IP, Port: r.Port, Instance: r.Instance}
}
