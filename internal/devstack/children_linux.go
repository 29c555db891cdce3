package devstack

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// No child outlives devstack, however it ends. Short of SIGKILL, devstack stops them
// itself (Run). Otherwise the kernel kills them: each is started with a parent-death
// signal, SIGKILL when devstack dies. The project's binaries get it from spawn; the
// servers libraries start (the SDK's dev server, envtest's etcd and kube-apiserver),
// which set no such signal, are started through tie.
//
// The kernel sends the signal when the thread that started the child ends, not the
// process. Go ends a thread only when a goroutine locked to it returns; devstack locks
// none.

// childAttr is how devstack starts a child: in a process group of its own, so a terminal's
// Ctrl-C reaches devstack, which stops the children in order; and killed by the kernel if
// devstack dies first.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

const (
	// tiedEnvPrefix + a tied name, in devstack's environment, is the binary a link of that
	// name runs (PROXYFLEET_DEVSTACK_TIED_ETCD).
	tiedEnvPrefix = "PROXYFLEET_DEVSTACK_TIED_"
	// parentEnv is devstack's process ID, which a tied child checks its parent against.
	parentEnv = "PROXYFLEET_DEVSTACK_PID"
)

func tiedEnv(name string) string {
	return tiedEnvPrefix + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(name))
}

// tie returns what to start instead of bin so that it dies with devstack: a link in dir,
// named name, to devstack's own executable. Started through it, devstack's main (RunTied)
// asks the kernel for SIGKILL at its parent's death and executes bin in its place, which
// keeps the request.
func tie(dir, name, bin string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find devstack's executable: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	link := filepath.Join(dir, name)
	_ = os.Remove(link)
	if err := os.Symlink(self, link); err != nil {
		return "", err
	}
	// Libraries start their children with devstack's environment, the only channel there is.
	if err := os.Setenv(tiedEnv(name), bin); err != nil {
		return "", err
	}
	return link, os.Setenv(parentEnv, strconv.Itoa(os.Getpid()))
}

// RunTied returns at once unless this process was started through a link tie made. Then it
// never returns: it has the kernel send it SIGKILL when devstack dies and executes the real
// binary, which keeps that. cmd/devstack calls it first thing.
func RunTied() {
	bin, parent := os.Getenv(tiedEnv(filepath.Base(os.Args[0]))), os.Getenv(parentEnv)
	if bin == "" || parent == "" {
		return
	}
	// The signal belongs to the thread that asks for it; it must be the one that executes.
	runtime.LockOSThread()
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0); errno != 0 {
		fmt.Fprintf(os.Stderr, "devstack: set the parent-death signal for %s: %v\n", bin, errno)
		os.Exit(1)
	}
	if strconv.Itoa(os.Getppid()) != parent {
		os.Exit(1) // devstack died before the signal was asked for
	}
	err := syscall.Exec(bin, append([]string{bin}, os.Args[1:]...), os.Environ())
	fmt.Fprintf(os.Stderr, "devstack: exec %s: %v\n", bin, err)
	os.Exit(127)
}
