package testenv

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a child a test runs and may kill with SIGKILL and start again with the same
// command line: a server of testenv's or one of the project's binaries. It runs in its own
// process group (a terminal's Ctrl-C reaches the test, which stops it in order) and the
// kernel kills it if the test process dies without cleaning up (a -timeout panic): a
// leftover server would hold its port and keep retrying against a stack that is gone.
type Process struct {
	Name string
	Path string
	Args []string
	Env  []string  // added to the test process's environment
	Out  io.Writer // stdout and stderr of every run; nil discards them

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when the current run ends
	err    error         // how it ended
}

// Start runs the command. It is an error while a run is still going.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited: // the last run ended on its own
		default:
			return fmt.Errorf("%s is already running", p.Name)
		}
	}
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	out := p.Out
	if out == nil {
		out = io.Discard
	}
	fmt.Fprintf(out, "==== %s start %s\n", p.Name, time.Now().Format(time.RFC3339Nano))
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

// Pid is the current run's process ID (0 when nothing was started).
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Exited is closed when the current run ends; nil when nothing was started.
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// Running reports whether a run is going. After a run ended on its own, it says how.
func (p *Process) Running() (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false, errors.New("not started")
	}
	select {
	case <-p.exited:
		return false, p.err
	default:
		return true, nil
	}
}

// Kill sends SIGKILL to the process group and waits until the run has ended.
func (p *Process) Kill() error {
	return p.end(syscall.SIGKILL, 0)
}

// Stop sends SIGTERM, and SIGKILL if the run has not ended after grace. Stopping what is
// not running does nothing.
func (p *Process) Stop(grace time.Duration) error {
	return p.end(syscall.SIGTERM, grace)
}

func (p *Process) end(sig syscall.Signal, grace time.Duration) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		if sig == syscall.SIGKILL {
			return fmt.Errorf("%s is not running", p.Name)
		}
		return nil
	}
	err := syscall.Kill(-cmd.Process.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		err = nil // it had ended already
	}
	if sig != syscall.SIGKILL {
		select {
		case <-exited:
		case <-time.After(grace):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}
	<-exited
	if p.Out != nil {
		fmt.Fprintf(p.Out, "==== %s %s %s\n", p.Name, sig, time.Now().Format(time.RFC3339Nano))
	}
	p.mu.Lock()
	p.cmd = nil
	p.mu.Unlock()
	return err
}

// LoggedProcess returns a Process of the binary whose runs all write to one log file in
// the test's temp dir. When the test ends it is stopped, and if the test failed the end
// of its log is printed.
func LoggedProcess(t testing.TB, name, path string, env []string, args ...string) *Process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("testenv: %s log: %v", name, err)
	}
	p := &Process{Name: name, Path: path, Args: args, Env: env, Out: f}
	t.Cleanup(func() {
		_ = p.Stop(15 * time.Second)
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("%s log (%s), last lines:\n%s", name, logPath, b)
		}
	})
	return p
}

var (
	commandsOnce sync.Once
	commandsDir  string
	commandsErr  error
)

// Command builds the module's commands (./cmd/...) once per test process and returns the
// path of one of them. testenv.Run removes the build when the tests end.
func Command(t testing.TB, name string) string {
	t.Helper()
	commandsOnce.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			commandsErr = err
			return
		}
		if commandsDir, commandsErr = os.MkdirTemp("", "proxyfleet-cmd-"); commandsErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", commandsDir+string(filepath.Separator), "./cmd/...")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			commandsErr = fmt.Errorf("go build ./cmd/...: %v\n%s", err, out)
		}
	})
	if commandsErr != nil {
		t.Fatalf("testenv: %v", commandsErr)
	}
	return filepath.Join(commandsDir, name)
}
