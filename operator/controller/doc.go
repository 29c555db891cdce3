// Package controller is the thin Kubernetes side of the system: it turns Proxy events into
// Temporal signals (SignalWithStart "spec", "delete") and holds a finalizer until the
// Proxy's workflow has deleted its instance. A periodic resync in the elected leader starts
// again the workflows of live Proxies that stopped running (Resync). It never writes Proxy
// status; the workflow is the single writer, through an activity.
//
// ProxyPools are kept here too (pool_controller.go, poolplan.go), as a ReplicaSet is: a
// pool's Proxies are the durable part, each with its workflow, so the pool is plain
// level-triggered Kubernetes — it creates, updates and deletes Proxies within its rolling
// budget and writes its own status from theirs.
package controller

// The operator's permissions, kept beside the code that needs them and rendered into
// deploy/rbac/operator by `make generate`.
//
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxypools,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxypools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxypools/finalizers,verbs=update
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
