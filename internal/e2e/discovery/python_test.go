package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// debianPython is the interpreter Debian's python3-scrapy and python3-pytest are installed
// for (hack/deps/apt.sh), whatever python3 comes first on the PATH.
const debianPython = "/usr/bin/python3"

// TestPythonClientAndScrapy runs the Python package's tests (discovery/client/python)
// against the real stack: the Temporal dev server, the worker and eight local proxies,
// each leaving from a loopback address of its own, and discovery with its gateway. Real
// Scrapy crawls sites on loopback that ban one proxy, by leases and through the gateway,
// and crawls one site spread over the fleet: eight proxies, as many as the crawl's
// concurrency, so that a crawl that sticks to a few of them shows.
func TestPythonClientAndScrapy(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the sites tell proxies apart by their 127.88.x.y addresses: Linux only")
	}
	if err := exec.Command(debianPython, "-c", "import scrapy, pytest").Run(); err != nil {
		t.Fatalf("%s lacks scrapy or pytest (%v): run `make deps` (hack/deps/apt.sh installs python3-scrapy and python3-pytest)", debianPython, err)
	}
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	const proxies = 8
	for i := range proxies {
		require.NoError(t, s.Kube.Client.Create(ctx, stack.Tagged(s.LocalProxy(ns, fmt.Sprintf("py-%d", i)), ns)))
	}
	for i := range proxies {
		s.WaitFor(t, ns, fmt.Sprintf("py-%d", i), 2*time.Minute, "Ready", stack.Ready)
	}
	d := s.StartDiscovery(t)
	selector, err := json.Marshal(map[string]string{"run": ns})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return len(d.Store.List(map[string]string{"run": ns}, ptr(true))) == proxies
	}, time.Minute, 100*time.Millisecond, "discovery never offered every proxy")

	root, err := testenv.RepoRoot()
	require.NoError(t, err)
	dir := filepath.Join(root, "discovery", "client", "python")
	cmd := exec.Command(debianPython, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir, "PYTHONDONTWRITEBYTECODE=1",
		"PROXYFLEET_TEST_URL="+d.URL, "PROXYFLEET_TEST_TOKEN="+d.Token, "PROXYFLEET_TEST_GATEWAY="+d.GatewayAddr,
		"PROXYFLEET_TEST_SELECTOR="+string(selector))
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	require.NoError(t, err, "the Python tests failed")
	require.NotContains(t, string(out), "skipped", "every Python test must run here")
}

func ptr[T any](v T) *T { return &v }
