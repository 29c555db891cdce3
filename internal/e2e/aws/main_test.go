// Package aws walks Proxies of the aws provider through the whole system: the operator,
// Temporal, the worker with --providers aws, against the fake EC2 API, whose instances boot
// their user data into real Squid on loopback. What it proves, and what only real EC2
// could, is listed in docs/providers.md.
package aws

import (
	"os"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// TestMain starts this group's Temporal dev server and kube-apiserver, shared by its tests.
func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{Temporal: true, Kube: true}))
}
