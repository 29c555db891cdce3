package testenv

// Fault tests kill -9 the servers and start them again. The Temporal dev server then runs
// as a plain child process on a database file (testsuite.DevServer keeps its process to
// itself), and the kube-apiserver that envtest started is found among this process's
// children, killed, and started again with the exact command line envtest gave it: same
// port, certificates and etcd, so every client's rest.Config stays valid.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"k8s.io/client-go/kubernetes"

	"github.com/proxyfleet/proxyfleet/workflows"
)

// devServer is a Temporal dev server run as a child process on a database file, so it can
// be killed and started again with its data.
type devServer struct {
	bin      string
	args     []string
	hostPort string
	dir      string // holds the database file
	out      io.Writer

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan error
}

// FreePorts returns n distinct free ports on 127.0.0.1 for servers that must come back on
// the same port after a restart. They are drawn below the kernel's ephemeral range: a port
// from that range, once its server is killed, can be taken as the source port of a client
// reconnecting to it (a TCP self-connect), and the restart would then fail to bind.
func FreePorts(n int) ([]int, error) {
	lo := 32768
	if raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(raw)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				lo = v
			}
		}
	}
	const base = 20000
	if lo <= base+n {
		return nil, fmt.Errorf("the ephemeral port range starts at %d: no room below it", lo)
	}
	var (
		ports []int
		held  []net.Listener
	)
	defer func() {
		for _, ln := range held {
			ln.Close()
		}
	}()
	start := base + rand.IntN(lo-base)
	for i := 0; i < lo-base && len(ports) < n; i++ {
		p := base + (start-base+i)%(lo-base)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		held = append(held, ln) // held until all are chosen, so none is picked twice
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, fmt.Errorf("found %d free ports below %d, need %d", len(ports), lo, n)
	}
	return ports, nil
}

func newDevServer(bin, dir string, out io.Writer) (*devServer, error) {
	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	args := []string{"server", "start-dev", "--ip", "127.0.0.1", "--headless",
		"--port", strconv.Itoa(ports[0]), "--http-port", strconv.Itoa(ports[1]), "--metrics-port", strconv.Itoa(ports[2]),
		"--db-filename", filepath.Join(dir, "temporal.sqlite"), "--log-level", "error"}
	for sa := range workflows.SearchAttributes().GetUntypedValues() {
		args = append(args, "--search-attribute", sa.GetName()+"="+sa.GetValueType().String())
	}
	return &devServer{bin: bin, args: args, hostPort: fmt.Sprintf("127.0.0.1:%d", ports[0]), dir: dir, out: out}, nil
}

// start runs the server and waits until its frontend answers.
func (d *devServer) start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		return errors.New("temporal dev server is already running")
	}
	cmd := exec.Command(d.bin, d.args...)
	cmd.Stdout, cmd.Stderr = d.out, d.out
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start temporal dev server: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	d.cmd, d.done = cmd, done
	for {
		c, err := client.Dial(client.Options{HostPort: d.hostPort, Logger: log.NewStructuredLogger(quietLogger())})
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case e := <-done:
			d.cmd = nil
			return fmt.Errorf("temporal dev server exited while starting: %v", e)
		case <-ctx.Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
			d.cmd = nil
			return fmt.Errorf("temporal dev server never answered on %s: %w", d.hostPort, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// childAttr puts a server in its own process group (so a terminal's Ctrl-C reaches the
// test first, which stops it in order) and has the kernel kill it if the test process
// dies without cleaning up (a -timeout panic): a leftover server would hold its port and
// keep retrying against a stack that is gone.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// kill sends SIGKILL to the server and waits for it to be gone.
func (d *devServer) kill() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return errors.New("temporal dev server is not running")
	}
	err := syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	<-d.done
	d.cmd = nil
	return err
}

// stop ends the server gracefully, or kills it after 10 seconds.
func (d *devServer) stop() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return nil
	}
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.done
	}
	d.cmd = nil
	return nil
}

// KillServer kills the dev server with SIGKILL. Only for a package whose TestMain asked for
// Options.TemporalRestartable.
func (e *TemporalEnv) KillServer(t testing.TB) {
	t.Helper()
	if e.dev == nil {
		t.Fatal("testenv: the dev server is not restartable; set Options.TemporalRestartable")
	}
	if err := e.dev.kill(); err != nil {
		t.Fatalf("testenv: kill the dev server: %v", err)
	}
}

// StartServer starts the dev server again on the same port and database file, and waits
// until it answers.
func (e *TemporalEnv) StartServer(t testing.TB) {
	t.Helper()
	if e.dev == nil {
		t.Fatal("testenv: the dev server is not restartable; set Options.TemporalRestartable")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.dev.start(ctx); err != nil {
		t.Fatalf("testenv: restart the dev server: %v", err)
	}
}

// apiServer tracks the kube-apiserver across restarts: first envtest's process, then the
// ones this package starts with envtest's command line.
type apiServer struct {
	mu   sync.Mutex
	args []string // the command line, read from /proc once
	cmd  *exec.Cmd
	done chan error
}

// childPID finds this process's child whose command name is comm.
func childPID(comm string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
		s := string(stat)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		fields := strings.Fields(s[closing+1:])
		if len(fields) < 2 || s[open+1:closing] != comm || fields[0] == "Z" {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == self {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no child process named %s", comm)
}

func (a *apiServer) kill() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil {
		err := syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.done
		a.cmd = nil
		return err
	}
	pid, err := childPID("kube-apiserver")
	if err != nil {
		return err
	}
	if a.args == nil {
		raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil {
			return err
		}
		a.args = strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	// envtest's own goroutine reaps it; wait until the kernel has let it go.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := childPID("kube-apiserver"); err != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver (pid %d) still running 30s after SIGKILL", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (a *apiServer) start(ctx context.Context, k *KubeEnv) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil {
		return errors.New("kube-apiserver is already running")
	}
	if a.args == nil {
		return errors.New("kube-apiserver was never killed, so it is still envtest's own and running")
	}
	cmd := exec.Command(a.args[0], a.args[1:]...)
	cmd.SysProcAttr = childAttr()
	if os.Getenv("TESTENV_VERBOSE") != "" {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	a.cmd, a.done = cmd, done
	cs, err := kubernetes.NewForConfig(k.Config)
	if err != nil {
		return err
	}
	for {
		_, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil {
			return nil
		}
		select {
		case e := <-done:
			a.cmd = nil
			return fmt.Errorf("kube-apiserver exited while starting: %v", e)
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready: %w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop ends a kube-apiserver this package restarted (envtest stops its own).
func (a *apiServer) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		return
	}
	_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.done
	}
	a.cmd = nil
}

// KillAPIServer kills the kube-apiserver with SIGKILL; etcd keeps running.
func (k *KubeEnv) KillAPIServer(t testing.TB) {
	t.Helper()
	if err := k.apiserver.kill(); err != nil {
		t.Fatalf("testenv: kill kube-apiserver: %v", err)
	}
}

// StartAPIServer starts the kube-apiserver again with the command line it had, and waits
// until /readyz answers.
func (k *KubeEnv) StartAPIServer(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := k.apiserver.start(ctx, k); err != nil {
		t.Fatalf("testenv: restart kube-apiserver: %v", err)
	}
}
