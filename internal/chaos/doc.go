// Package chaos is the fault suite (`make chaos`; a short version runs in CI). It runs the
// real system as processes — Temporal dev server on a database file, etcd + kube-apiserver,
// the operator, worker and discovery binaries, and the local provider's instances — and,
// while Proxies are created, replaced and deleted, kills each server with SIGKILL and
// starts it again; a last fault terminates a tenth of the Proxies' workflows by hand, which
// the operator's resync starts again. After each fault it checks what a user relies on: every Proxy reaches
// what its spec asks for, the provider holds exactly one instance per Proxy (none
// duplicated, none leaked, and a GC sweep finds nothing), no Proxy is stuck with its
// finalizer, and a crawler's ban report still rests the proxy for that site.
//
// The tests are behind the chaos build tag so `make test` does not pay for them.
package chaos
