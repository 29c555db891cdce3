package recovery

import (
	"os"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// TestMain starts this group's Temporal dev server and kube-apiserver, shared by its tests.
func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{Temporal: true, Kube: true}))
}
