// Package local is the provider for running a fleet on one machine: Provider drives the
// host daemon behind cmd/localproxyd (package internal/localproxy), which runs real forward
// proxies on 127.0.0.1, over a JSON control API whose types are here. Instances live in the
// daemon, not the worker, so they outlive worker restarts exactly as cloud instances do.
package local
