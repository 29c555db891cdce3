// Package contract is what every process agrees on about the project's workflows: the task
// queue, workflow types and IDs, the schedule ID, signal and query names, the signals'
// payloads, search attributes, the memo discovery reads, and the visibility queries that
// select ProxyWorkflows.
//
// It is a leaf: it imports only the Temporal SDK's small temporal package, never
// activities, Kubernetes or controller-runtime, so a process that only reads and signals
// workflows (discovery) links none of them. The spec signal is the one payload that is not
// here: it carries the Kubernetes Proxy spec, and stays beside the workflow in package
// workflows.
package contract
