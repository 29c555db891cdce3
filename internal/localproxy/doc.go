// Package localproxy is the host daemon behind cmd/localproxyd: real forward proxies on
// 127.0.0.1, created and deleted over a small JSON control API that the local provider
// (activities/provider/local) drives. Instances live in the daemon, not the worker, so they
// outlive worker restarts exactly as cloud instances do; a thousand of them cost a thousand
// idle listeners. The daemon is also run in-process by the test stack.
package localproxy
