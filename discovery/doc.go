// Package discovery is the lease domain of the crawler-facing side: the index of proxies,
// leases and their selection, cooldowns, sessions, the clients crawlers authenticate as,
// and the errors every answer is made of (codes from discovery/codes). Leases live in
// memory; cooldowns live in memory and durably in the proxies' workflows.
//
// The adapters live beside it, named by what they adapt, so the rules stay in one place
// and each technology in one package: discovery/gateway (the fleet as one forward proxy),
// discovery/temporal (the index read from visibility, reports signalled) and
// discovery/service (the process assembled). The HTTP API (Gin) and the replication
// between replicas are still here: the lease operations decide per call whether this
// replica or a peer acts.
package discovery
