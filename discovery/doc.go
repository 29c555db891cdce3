// Package discovery is the crawler-facing side: an HTTP API (Gin) that lists healthy
// proxies, leases them, and takes reports of bans. Its index of proxies is built from
// Temporal alone (each ProxyWorkflow's memo and search attributes), refreshed incrementally;
// leases live in memory, cooldowns live in memory and durably in the proxies' workflows.
package discovery
