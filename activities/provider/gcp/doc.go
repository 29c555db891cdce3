// Package gcp is the Compute Engine provider: one VM per Proxy instance, driven through the
// Compute REST API (instances insert, get, delete and aggregatedList, and zone operations
// get). Create waits for its insert operation, since a stockout or quota refusal is only
// reported there; Delete does not wait, and readiness and removal are observed by polling
// Get, exactly as for the other providers. Insert and delete carry request IDs derived from
// the instance, so a call retried after a crash or a timeout is recognised by GCE.
package gcp
