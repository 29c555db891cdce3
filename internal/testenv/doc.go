// Package testenv starts the real servers that integration tests share: a Temporal dev
// server (the pinned `temporal` CLI) with the project's search attributes, and a
// kube-apiserver + etcd through controller-runtime's envtest with the Proxy CRD installed.
//
// A package's TestMain calls Run once; tests then reach the servers through Temporal() and
// Kube(). Both listen on free 127.0.0.1 ports and are stopped when the tests end. Missing
// binaries are an error, not a skip: a test that silently does not run proves nothing.
// Every make target that runs tests builds them into bin/ first.
package testenv
