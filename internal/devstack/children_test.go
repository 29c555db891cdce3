//go:build devstack

package devstack_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

func TestMain(m *testing.M) {
	// No servers: testenv only removes the commands Command built.
	os.Exit(testenv.Run(m, testenv.Options{}))
}

// TestNoChildOutlivesDevstack starts the devstack binary, waits until it is ready, ends it
// one way or another, and checks that every process it started is gone. Unlike `make
// dev`, it uses ports of its own and a copy of the repository's layout in a temp dir, so
// it can run beside a `make dev`.
func TestNoChildOutlivesDevstack(t *testing.T) {
	root := devstackRoot(t)
	devstack := testenv.Command(t, "devstack")
	cases := []struct {
		name string
		sig  syscall.Signal
		// group sends the signal to devstack's process group, as a terminal does.
		group bool
		// closeStdout takes the reader of devstack's stdout away first, as Ctrl-C does
		// to tee in `make dev | tee dev.log`.
		closeStdout bool
		// clean: devstack stops everything itself and exits with status 0.
		clean bool
	}{
		{name: "Ctrl-C while piped into tee", sig: syscall.SIGINT, group: true, closeStdout: true, clean: true},
		{name: "terminal closed", sig: syscall.SIGHUP, group: true, clean: true},
		{name: "SIGKILL", sig: syscall.SIGKILL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ports, err := testenv.FreePorts(5)
			require.NoError(t, err)
			cmd := exec.Command(devstack, "--state-dir", t.TempDir(), "--proxies", "1",
				"--temporal-port", strconv.Itoa(ports[0]), "--ui-port", strconv.Itoa(ports[1]),
				"--discovery-port", strconv.Itoa(ports[2]), "--gateway-port", strconv.Itoa(ports[3]),
				"--daemon-port", strconv.Itoa(ports[4]))
			cmd.Dir = root
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a job of its own, as a shell starts it
			stdoutR, stdoutW, err := os.Pipe()
			require.NoError(t, err)
			stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
			require.NoError(t, err)
			cmd.Stdout, cmd.Stderr = stdoutW, stderr
			require.NoError(t, cmd.Start())
			stdoutW.Close()
			pid := cmd.Process.Pid
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			var started []proc
			t.Cleanup(func() {
				// Whatever the test found, nothing is left behind.
				_ = syscall.Kill(-pid, syscall.SIGKILL)
				for _, p := range started {
					if p.alive() {
						_ = syscall.Kill(p.pid, syscall.SIGKILL)
					}
				}
				stdoutR.Close()
				if t.Failed() {
					b, _ := os.ReadFile(stderr.Name())
					t.Logf("devstack's stderr:\n%s", b)
				}
			})

			lines := make(chan string)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(stdoutR)
				for sc.Scan() {
					lines <- sc.Text()
				}
			}()
			deadline := time.After(5 * time.Minute)
		ready:
			for {
				select {
				case l, ok := <-lines:
					require.True(t, ok, "devstack exited before it was ready")
					if strings.TrimSpace(l) == "READY" {
						break ready
					}
				case <-deadline:
					t.Fatal("devstack was not ready within 5 minutes")
				}
			}
			if tc.closeStdout {
				require.NoError(t, stdoutR.Close())
			} else {
				go func() {
					for range lines { // drained, as a terminal would
					}
				}()
			}

			started = descendants(pid)
			var names []string
			for _, p := range started {
				names = append(names, p.comm)
			}
			for _, want := range []string{"temporal", "etcd", "kube-apiserver", "localproxyd", "operator", "worker", "discovery"} {
				require.Contains(t, names, want, "devstack's children")
			}

			target := pid
			if tc.group {
				target = -pid
			}
			require.NoError(t, syscall.Kill(target, tc.sig))
			select {
			case err := <-exited:
				if tc.clean {
					assert.NoError(t, err, "devstack stops everything and exits")
				}
			case <-time.After(2 * time.Minute):
				t.Fatal("devstack did not exit within 2 minutes")
			}
			left := started
			for end := time.Now().Add(30 * time.Second); len(left) > 0 && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				left = alive(started)
			}
			assert.Empty(t, left, "processes devstack started are still running")
		})
	}
}

// devstackRoot is a directory laid out as devstack expects the repository: bin/ with the
// pinned tools (from the repository's bin/, built by `make tools`) and the project's
// binaries built from this tree, and the CRD.
func devstackRoot(t *testing.T) string {
	t.Helper()
	repo, err := testenv.RepoRoot()
	require.NoError(t, err)
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "deploy"), 0o755))
	link := func(from, to string) {
		t.Helper()
		_, err := os.Stat(from)
		require.NoError(t, err, "run `make tools`")
		require.NoError(t, os.Symlink(from, filepath.Join(root, to)))
	}
	link(filepath.Join(repo, "bin", "temporal"), "bin/temporal")
	link(filepath.Join(repo, "bin", "k8s"), "bin/k8s")
	link(filepath.Join(repo, "deploy", "crd"), "deploy/crd")
	for _, c := range []string{"operator", "worker", "discovery", "localproxyd"} {
		link(testenv.Command(t, c), filepath.Join("bin", c))
	}
	return root
}

// proc is a process, told apart from a later one with the same ID by its start time.
type proc struct {
	pid   int
	comm  string
	start string
}

// readProc reads /proc/<pid>/stat: the command name, the state, the parent and the start
// time (the name may hold spaces and parentheses, so fields are read after the last ')').
func readProc(pid int) (p proc, state string, ppid int, ok bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return proc{}, "", 0, false
	}
	s := string(raw)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return proc{}, "", 0, false
	}
	f := strings.Fields(s[closing+1:])
	if len(f) < 20 {
		return proc{}, "", 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	return proc{pid: pid, comm: s[open+1 : closing], start: f[19]}, f[0], ppid, true
}

// descendants lists the live processes below pid.
func descendants(pid int) []proc {
	children := map[int][]proc{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, state, ppid, ok := readProc(n); ok && state != "Z" {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []proc
	for queue := []int{pid}; len(queue) > 0; queue = queue[1:] {
		for _, c := range children[queue[0]] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}

func (p proc) alive() bool {
	now, state, _, ok := readProc(p.pid)
	return ok && state != "Z" && now.start == p.start
}

// alive names the processes of ps still running.
func alive(ps []proc) []proc {
	var out []proc
	for _, p := range ps {
		if p.alive() {
			out = append(out, p)
		}
	}
	return out
}
