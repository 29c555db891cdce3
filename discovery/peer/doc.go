// Package peer is discovery's replica set, over HTTP: this replica's calls to the others.
// It copies every lease change the replica makes to its peers (batched per peer, and a
// peer that falls behind caught up with every lease the replica owns), restores the
// replica's leases from them when it starts, and carries to another replica the grants,
// renewals, releases and reports that replica must make as the owner of a proxy or a
// lease.
//
// It exists so that the lease domain (package discovery) decides who acts without knowing
// how replicas talk: the domain declares discovery.Peers and keeps the lease table and its
// copies (LeaseRecord, Store.Apply, Snapshot, Owned), which only the store's lock may
// touch; this package is the transport and its state (who is down or behind, whether this
// replica is restored). The routes replicas call each other on are served with the rest
// of discovery's HTTP routes by discovery/httpapi.
package peer
