// Package activities is everything ProxyWorkflow and GCWorkflow do to the world: provider
// Create/Get/Delete, probes through the proxy, Proxy status patches and cloud-init Secret
// hashing. Activities are idempotent, so Temporal may retry any of them at any point.
//
// Watching proxies is package activities/monitor: the Monitor and MonitorShard activities
// here only build its Env from the worker (providers, credentials, call timeouts),
// heartbeat, and turn its errors into Temporal's.
package activities

// The worker's permissions, rendered into deploy/rbac/worker by `make generate`. Secrets are
// read to hash cloud-init and hand it to a provider and to read External proxies'
// credentials, whose data never leaves the activity; the kubernetes provider writes one
// Secret per Squid pod (its rendered configuration, holding a password hash) and one
// NetworkPolicy, and deletes them with the pod. Nothing is watched: every read goes to the
// API server. Which namespaces pods go to is limited by the worker's own allowlist
// (--kubernetes-allowed-namespaces); deploy/ documents binding these rules per namespace.
// A Proxy itself is patched once, to remove its finalizer when its last instance is gone
// (ReleaseFinalizer); deploy/deployed runs the worker as this ServiceAccount, so a verb
// missing here fails a test rather than a deletion in someone's cluster.
//
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies,verbs=get;list;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;create;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;create;update;patch;delete
