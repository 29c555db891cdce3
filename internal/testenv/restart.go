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

	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// devServer is a Temporal dev server run as a child process on a database file, so it can
// be killed and started again with its data.
type devServer struct {
	proc     *Process
	hostPort string
	dir      string // holds the database file
	// metricsURL is the server's Prometheus endpoint.
	metricsURL string
}

// FreePorts returns n distinct free ports on 127.0.0.1 for servers that must come back on
// the same port after a restart. They are drawn below the kernel's ephemeral range: a port
// from that range, once its server is killed, can be taken as the source port of a client
// reconnecting to it (a TCP self-connect), and the restart would then fail to bind.
//
// A port is free when nothing listens on it, which stays true only until its server
// binds: meanwhile another caller, in this process or another test process (CI runs
// suites side by side), could be handed the same port, and one of the two servers would
// then answer the other's clients. So each port handed out is also reserved, for as long
// as this process lives, by a lock on a file named after it (reserve), which every caller
// respects.
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
	var ports []int
	start := base + rand.IntN(lo-base)
	for i := 0; i < lo-base && len(ports) < n; i++ {
		p := base + (start-base+i)%(lo-base)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		ln.Close()
		// Nothing listens on it; the reservation keeps it from every other caller.
		if reserve(p) {
			ports = append(ports, p)
		}
	}
	if len(ports) < n {
		return nil, fmt.Errorf("found %d free ports below %d, need %d", len(ports), lo, n)
	}
	return ports, nil
}

// reserved holds the lock files of the ports this process was handed by FreePorts.
var reserved = struct {
	sync.Mutex
	files map[int]*os.File
}{files: map[int]*os.File{}}

// reserve takes port p for this process unless it, or another process, has it already. The
// reservation is an exclusive flock on a file named after the port in the machine's
// temporary directory, held until the process exits (the kernel then drops it, however
// the process ended). Where no lock file can be made, the bind check alone decides.
func reserve(p int) bool {
	reserved.Lock()
	defer reserved.Unlock()
	if _, ok := reserved.files[p]; ok {
		return false
	}
	dir, err := portLockDir()
	if err != nil {
		return true
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	reserved.files[p] = f
	return true
}

// portLockDir is where the ports' lock files are, made once per process.
var portLockDir = sync.OnceValues(func() (string, error) {
	dir := filepath.Join(os.TempDir(), "proxyfleet-test-ports")
	return dir, os.MkdirAll(dir, 0o777)
})

func newDevServer(bin, dir string, out io.Writer) (*devServer, error) {
	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	args := []string{"server", "start-dev", "--ip", "127.0.0.1", "--headless",
		"--port", strconv.Itoa(ports[0]), "--http-port", strconv.Itoa(ports[1]), "--metrics-port", strconv.Itoa(ports[2]),
		"--db-filename", filepath.Join(dir, "temporal.sqlite"), "--log-level", "error"}
	for sa := range contract.SearchAttributes().GetUntypedValues() {
		args = append(args, "--search-attribute", sa.GetName()+"="+sa.GetValueType().String())
	}
	return &devServer{
		proc:     &Process{Name: "temporal dev server", Path: bin, Args: args, Out: out},
		hostPort: fmt.Sprintf("127.0.0.1:%d", ports[0]), dir: dir,
		metricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[2]),
	}, nil
}

// start runs the server and waits until its frontend answers.
func (d *devServer) start(ctx context.Context) error {
	return startAndWait(ctx, d.proc, func(context.Context) error {
		c, err := client.Dial(client.Options{HostPort: d.hostPort, Logger: log.NewStructuredLogger(quietLogger())})
		if err == nil {
			c.Close()
		}
		return err
	})
}

// startAndWait starts p and polls ready until it succeeds; p exiting first, or ctx ending,
// is an error (and a run that never became ready is killed).
func startAndWait(ctx context.Context, p *Process, ready func(context.Context) error) error {
	if err := p.Start(); err != nil {
		return err
	}
	exited := p.Exited()
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			_, why := p.Running()
			return fmt.Errorf("%s exited while starting: %v (last check: %v)", p.Name, why, err)
		case <-ctx.Done():
			_ = p.Kill()
			return fmt.Errorf("%s never became ready: %w (last check: %v)", p.Name, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// KillServer kills the dev server with SIGKILL. Only for a package whose TestMain asked for
// Options.TemporalRestartable.
func (e *TemporalEnv) KillServer(t testing.TB) {
	t.Helper()
	if e.dev == nil {
		t.Fatal("testenv: the dev server is not restartable; set Options.TemporalRestartable")
	}
	if err := e.dev.proc.Kill(); err != nil {
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
// ones this package starts with envtest's command line (proc, set at the first kill).
type apiServer struct {
	mu   sync.Mutex
	proc *Process
}

// ProcStat is what /proc/<pid>/stat says of a process that tests care about.
type ProcStat struct {
	Comm   string
	PPID   int
	Zombie bool
	CPU    time.Duration // user + system
}

// clockTick is the kernel's USER_HZ, 100 on every Linux this runs on.
const clockTick = 10 * time.Millisecond

// ReadProcStat parses /proc/<pid>/stat. The command name may hold spaces and parentheses,
// so the fields are read after the last ')'.
func ReadProcStat(pid int) (ProcStat, error) {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ProcStat{}, err
	}
	s := string(raw)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	// After ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
	var f []string
	if open >= 0 && closing > open {
		f = strings.Fields(s[closing+1:])
	}
	if len(f) < 13 {
		return ProcStat{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	ppid, _ := strconv.Atoi(f[1])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return ProcStat{Comm: s[open+1 : closing], PPID: ppid, Zombie: f[0] == "Z", CPU: time.Duration(ut+st) * clockTick}, nil
}

// Children lists the live (not zombie) child processes of this test process.
func Children() map[int]ProcStat {
	out := map[int]ProcStat{}
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := ReadProcStat(pid); err == nil && st.PPID == self && !st.Zombie {
			out[pid] = st
		}
	}
	return out
}

// childPID finds this process's child whose command name is comm.
func childPID(comm string) (int, bool) {
	for pid, st := range Children() {
		if st.Comm == comm {
			return pid, true
		}
	}
	return 0, false
}

func (a *apiServer) kill() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc != nil {
		return a.proc.Kill()
	}
	pid, ok := childPID("kube-apiserver")
	if !ok {
		return errors.New("no child process named kube-apiserver")
	}
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return err
	}
	args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	var out io.Writer
	if os.Getenv("TESTENV_VERBOSE") != "" {
		out = os.Stderr
	}
	a.proc = &Process{Name: "kube-apiserver", Path: args[0], Args: args[1:], Out: out}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	// envtest's own goroutine reaps it; wait until the kernel has let it go.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok := childPID("kube-apiserver"); !ok {
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
	if a.proc == nil {
		return errors.New("kube-apiserver was never killed, so it is still envtest's own and running")
	}
	cs, err := kubernetes.NewForConfig(k.Config)
	if err != nil {
		return err
	}
	return startAndWait(ctx, a.proc, func(ctx context.Context) error {
		_, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	})
}

// stop ends a kube-apiserver this package restarted (envtest stops its own).
func (a *apiServer) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc != nil {
		_ = a.proc.Stop(20 * time.Second)
	}
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

// FreeAddr is a 127.0.0.1 address nothing listens on now: a port for a server the test
// starts, or a proxy that refuses connections.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free address: %v", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatalf("free address: %v", err)
	}
	return addr
}
