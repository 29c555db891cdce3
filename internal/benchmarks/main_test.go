package benchmarks

import (
	"flag"
	"os"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// TestMain starts the Temporal dev server and the kube-apiserver only when a benchmark
// will run. make test runs go test ./..., which runs this package without -bench: there
// is nothing here to run then but TestGatewayBenchHelper, which skips, and starting the
// servers would cost every make test their start-up for nothing.
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(helperEnv) != "" {
		// A helper process of a gateway benchmark (startHelper) needs no servers.
		os.Exit(m.Run())
	}
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run())
	}
	os.Exit(testenv.Run(m, testenv.Options{Temporal: true, Kube: true}))
}
