// Package gcp is the Compute Engine provider: one VM per Proxy instance, driven through the
// Compute REST API (instances insert, get, delete and aggregatedList; firewalls insert, get,
// update, delete and list; zone and global operations get).
//
// Every VM boots the hardened Squid of package squid: its startup-script metadata installs
// and configures Squid (credentials required, private destinations refused, client headers
// stripped) and then runs the Proxy's own cloud-init data, if any. Every VM with
// spec.gcp.allowedSourceRanges is admitted by a firewall rule it shares with the
// installation's other VMs of the same network, ranges and port (a project holds a few
// hundred rules, a fleet thousands of VMs); the rule is made before the VM, put back by
// Get when it drifts, and deleted by the orphan sweep once no VM uses it. VMs made before
// rules were shared keep their own rules, deleted with them (see firewall.go).
//
// Create waits for its operations, since a stockout or quota refusal is only reported
// there; Delete does not wait, and readiness and removal are observed by polling Get,
// exactly as for the other providers. Inserts and deletes carry request IDs derived from
// the instance, so a call retried after a crash or a timeout is recognised by GCE.
package gcp
