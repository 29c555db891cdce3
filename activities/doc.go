// Package activities is everything ProxyWorkflow and GCWorkflow do to the world: provider
// Create/Get/Delete, probes through the proxy, Proxy status patches and cloud-init Secret
// hashing. Activities are idempotent, so Temporal may retry any of them at any point.
package activities

// The worker's permissions, rendered into deploy/rbac/worker by `make generate`. Secrets are
// read only to hash them and to hand cloud-init to a provider; their data never leaves the
// activity.
//
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies,verbs=get;list;watch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
