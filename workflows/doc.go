// Package workflows holds the Temporal workflows that own each Proxy's life and the orphan
// sweep. Workflow code here is deterministic and does no I/O: everything that touches the
// world is an activity in package activities.
//
// The names and payloads other processes use to reach these workflows live in the leaf
// package workflows/contract; Register is the one place a worker learns about them.
package workflows
