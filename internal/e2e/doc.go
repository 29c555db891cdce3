// Package e2e runs the whole system on real parts: a Temporal dev server, a kube-apiserver
// with the CRD, the controller, a worker and real forward proxies on loopback. It checks
// that the system works; what it costs and how fast it goes is measured on the same parts
// by internal/benchmarks.
package e2e
