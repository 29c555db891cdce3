// Package discovery is the lease domain of the crawler-facing side: the index of proxies,
// leases and their selection, cooldowns, sessions, the clients crawlers authenticate as,
// the lease operations over them (Server: grant, renew, release, report, list), and the
// errors every answer is made of (codes from discovery/codes). Leases live in memory;
// cooldowns live in memory and durably in the proxies' workflows.
//
// The adapters live beside it, named by what they adapt, so the rules stay in one place
// and each technology in one package: discovery/httpapi (the HTTP API, in Gin),
// discovery/gateway (the fleet as one forward proxy), discovery/peer (the replica set, over
// HTTP), discovery/temporal (the index read from visibility, reports signalled) and
// discovery/service (the process assembled). The lease operations decide per call whether
// this replica or a peer acts, and ask the peer through the Peers interface declared here;
// the lease table's copies (LeaseRecord, Store.Apply, Snapshot, Owned) stay here too, as
// only the store's lock may touch the table.
package discovery
