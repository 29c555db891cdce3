//go:build devstack

// This test is `make test-e2e`: it runs `make dev` the way a newcomer would and drives the
// stack only with the commands it prints. It binds the fixed ports of `make dev`, so it
// runs on its own (build tag devstack), not inside `make test`.
package devstack_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

func TestMakeDevAsAUserWould(t *testing.T) {
	root, err := testenv.RepoRoot()
	require.NoError(t, err)
	cmd := exec.Command("make", "dev")
	cmd.Dir = root
	// Every process make dev starts inherits this mark, which tells them from the same
	// binaries other suites run on the machine meanwhile (CI runs suites side by side).
	mark := fmt.Sprintf("PROXYFLEET_DEVSTACK_TEST=%d-%d", os.Getpid(), time.Now().UnixNano())
	cmd.Env = append(os.Environ(), mark)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	require.NoError(t, cmd.Start())
	pgid := cmd.Process.Pid
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		// Ctrl-C in a terminal signals the whole foreground process group.
		_ = syscall.Kill(-pgid, syscall.SIGINT)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			t.Error("make dev did not stop within 90s of Ctrl-C")
			<-done
		}
	}
	t.Cleanup(stop)

	// Read what it prints until it says it is ready.
	printed := map[string]string{}
	var transcript strings.Builder
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	deadline := time.After(10 * time.Minute)
wait:
	for {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "make dev exited before it was ready:\n%s", transcript.String())
			transcript.WriteString(l + "\n")
			if k, v, found := strings.Cut(strings.TrimSpace(l), ":"); found && strings.Contains(v, " ") {
				printed[k] = strings.TrimSpace(v)
			}
			if strings.TrimSpace(l) == "READY" {
				break wait
			}
		case <-deadline:
			t.Fatalf("make dev was not ready within 10 minutes:\n%s", transcript.String())
		}
	}
	go func() {
		for range lines { // keep draining so the stack never blocks on its stdout
		}
	}()
	t.Logf("make dev printed:\n%s", transcript.String())

	shell := func(command string) string {
		t.Helper()
		c := exec.Command("bash", "-c", command)
		c.Dir = root
		b, err := c.CombinedOutput()
		require.NoError(t, err, "%s\n%s", command, b)
		return string(b)
	}

	// The printed lease curl works and gives a proxy; a request through it reaches a target.
	require.Contains(t, printed, "Lease a proxy")
	var lease struct {
		LeaseID string               `json:"leaseID"`
		Proxy   struct{ URL string } `json:"proxy"`
	}
	require.NoError(t, json.Unmarshal([]byte(shell(printed["Lease a proxy"])), &lease))
	require.NotEmpty(t, lease.LeaseID)
	body := shell(fmt.Sprintf("curl -sS --fail -x %s http://127.0.0.1:8089/healthz", lease.Proxy.URL))
	assert.Contains(t, body, `"status":"ok"`)
	assert.Contains(t, shell(printed["Fetch through it"]), `"status":"ok"`)
	// The printed gateway line: one address for the whole fleet, each request on a proxy
	// of its own.
	require.Contains(t, printed, "Or via the gateway")
	through := map[string]bool{}
	for range 3 {
		out := shell(printed["Or via the gateway"])
		assert.Contains(t, out, `"status":"ok"`)
		for _, l := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Proxyfleet-Proxy: "); ok {
				through[v] = true
			}
		}
	}
	assert.GreaterOrEqual(t, len(through), 2, "requests through the gateway rotate over the proxies")
	// The printed Scrapy line: a real spider through the gateway (Debian's python3-scrapy,
	// which make deps installs).
	require.Contains(t, printed, "Crawl with Scrapy")
	crawled := shell(printed["Crawl with Scrapy"])
	for i := range 6 {
		assert.Contains(t, crawled, fmt.Sprintf("page %d: 200 via default/local-", i), crawled)
	}

	// The printed CLI line replaces local-1, make-before-break; kubectl shows it.
	assert.Contains(t, shell("bin/kubectl get proxies"), "local-1", "bin/kubectl talks to the dev stack")
	kubectl := "bin/kubectl get proxy local-1 -o jsonpath='{.status.replacements}/{.status.phase}'"
	require.Equal(t, "/Ready", strings.TrimSpace(shell(kubectl)), "no replacement yet")
	shell(printed["Replace local-1"])
	require.Eventually(t, func() bool {
		return strings.TrimSpace(shell(kubectl)) == "1/Ready"
	}, 2*time.Minute, 500*time.Millisecond, "local-1 was not replaced after the printed signal")
	assert.Contains(t, printed["Web UI"], "http://127.0.0.1:8233")

	// README tour step 7: kill local-2's instance; it is recreated and Ready again within
	// seconds. The drift check runs only every 2 minutes here (production timings): the
	// unhealthy verdict itself asks the provider.
	local2 := "bin/kubectl get proxy local-2 -o jsonpath='{.status.instanceName}/{.status.phase}'"
	killed, _, _ := strings.Cut(strings.TrimSpace(shell(local2)), "/")
	require.NotEmpty(t, killed)
	shell(fmt.Sprintf("curl -sS --fail -X POST http://127.0.0.1:8089/v1/instances/%s/kill", killed))
	at := time.Now()
	require.Eventually(t, func() bool {
		name, phase, _ := strings.Cut(strings.TrimSpace(shell(local2)), "/")
		return name != killed && phase == "Ready"
	}, time.Minute, 500*time.Millisecond, "local-2 was not recreated within a minute of the kill")
	t.Logf("local-2 recreated and Ready %s after its instance was killed", time.Since(at).Round(100*time.Millisecond))

	// README tour step 9: a pool of 0..5 has no proxy until crawled; the printed crawl
	// through the gateway waits while it grows and gets every page; idle again, it shrinks
	// back to no proxy.
	require.Contains(t, printed, "A pool of 0..5")
	shell(printed["A pool of 0..5"])
	poolSize := "bin/kubectl get proxypool tour -o jsonpath='{.spec.replicas}'"
	require.Equal(t, "0", strings.TrimSpace(shell(poolSize)))
	at = time.Now()
	pages := strings.Fields(shell(printed["Crawl the pool"]))
	t.Logf("60 pages of 2s through a pool scaled from zero in %s", time.Since(at).Round(100*time.Millisecond))
	assert.Len(t, pages, 60)
	for _, code := range pages {
		require.Equal(t, "200", code, "every request through the pool, waiting while it grew: %v", pages)
	}
	assert.Equal(t, "5", strings.TrimSpace(shell(poolSize)), "eight crawlers at once over proxies of one lease each grow the pool to its maximum")
	assert.Contains(t, shell("bin/kubectl describe proxypool tour"), "scaled from 0 to")
	require.Eventually(t, func() bool {
		return strings.TrimSpace(shell(poolSize)) == "0" &&
			strings.TrimSpace(shell("bin/kubectl get proxies -l crawl.example.com/pool=tour -o name")) == ""
	}, 3*time.Minute, time.Second, "the idle pool shrinks back to no proxy")

	// The mark reaches the stack's servers, so its absence below means they are gone.
	running := strings.Join(marked(mark), "\n")
	for _, name := range []string{"temporal", "etcd", "kube-apiserver"} {
		require.Contains(t, running, " "+name, "make dev's processes carry the mark")
	}

	// Ctrl-C stops everything: nothing of the group is left, and the ports are free again.
	stop()
	assert.ErrorIs(t, syscall.Kill(-pgid, 0), syscall.ESRCH, "processes of make dev are still running")
	assert.Empty(t, marked(mark), "processes make dev started are still running")
	for _, port := range []int{7233, 8233, 8089, 8090, 8091} {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if assert.NoError(t, err, "port %d is still in use after Ctrl-C", port) {
			ln.Close()
		}
	}
	_, err = os.Stat(filepath.Join(root, ".state", "logs", "worker.log"))
	assert.NoError(t, err, "logs are kept in the state directory")
}

// marked lists the processes (pid and name) whose environment holds mark: those started by
// make dev, whichever process group they put themselves in.
func marked(mark string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		env, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !slices.Contains(strings.Split(string(env), "\x00"), mark) {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join(d, "comm"))
		out = append(out, filepath.Base(d)+" "+strings.TrimSpace(string(comm)))
	}
	return out
}
