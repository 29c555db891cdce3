// Package gcp is the Compute Engine provider: one VM per Proxy instance, driven through the
// Compute REST API (instances insert, get, delete and aggregatedList; firewalls insert, get,
// update, delete and list; zone and global operations get).
//
// Every VM boots the hardened Squid of package squid: its startup-script metadata installs
// and configures Squid (credentials required, private destinations refused, client headers
// stripped) and then runs the Proxy's own cloud-init data, if any. Every VM with
// spec.gcp.allowedSourceRanges also gets a firewall rule of its own, named like it, that
// admits its proxy port from those ranges alone; the rule is made before the VM and
// deleted after it, and a rule left behind keeps its VM reported as deleting, so the
// workflow and the sweeper finish the job.
//
// Create waits for its operations, since a stockout or quota refusal is only reported
// there; Delete does not wait, and readiness and removal are observed by polling Get,
// exactly as for the other providers. Inserts and deletes carry request IDs derived from
// the instance, so a call retried after a crash or a timeout is recognised by GCE.
package gcp
