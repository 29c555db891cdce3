// Package e2e runs the whole system on real parts: a Temporal dev server, a kube-apiserver
// with the CRD, the controller, a worker and real forward proxies on loopback.
package e2e
