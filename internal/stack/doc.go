// Package stack assembles the running system inside a test process, on top of the real
// servers from testenv: a local proxy daemon, a target web server, the controller (in a
// controller-runtime manager), a Temporal worker and discovery, all on 127.0.0.1.
// End-to-end tests, benchmarks and fault tests share it. The worker is built by
// internal/worker and discovery by discovery/service, as cmd/ builds them; the controller
// is added by controller.Setup, as in the operator, to a manager without metrics server or
// leader election, since several stacks share one test binary.
package stack
