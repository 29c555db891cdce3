//go:build chaos

package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binary builds the module's commands once per run and returns one of them.
func binary(t *testing.T, name string) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "proxyfleet-chaos-bin-")
		if buildErr != nil {
			return
		}
		root, err := testenv.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		cmd := exec.Command("go", "build", "-o", binDir+string(filepath.Separator), "./cmd/...")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/...: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return filepath.Join(binDir, name)
}

// process is one of the system's binaries, run with the same command line every time it
// is started; its output from every run is appended to one log file.
type process struct {
	name string
	path string
	args []string
	env  []string
	log  string

	cmd  *exec.Cmd
	done chan error
	file *os.File
}

func newProcess(t *testing.T, name string, env []string, args ...string) *process {
	t.Helper()
	p := &process{name: name, path: binary(t, name), args: args, env: env,
		log: filepath.Join(t.TempDir(), name+".log")}
	f, err := os.Create(p.log)
	require.NoError(t, err)
	p.file = f
	t.Cleanup(func() {
		p.stop()
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("%s log (%s), last lines:\n%s", name, p.log, b)
		}
	})
	return p
}

func (p *process) start(t *testing.T) {
	t.Helper()
	require.Nil(t, p.cmd, "%s is already running", p.name)
	fmt.Fprintf(p.file, "==== start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = p.file, p.file
	// Killed by the kernel if the test process dies without its cleanups (a -timeout panic).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start(), "start %s", p.name)
	p.cmd, p.done = cmd, make(chan error, 1)
	go func(done chan error) { done <- cmd.Wait() }(p.done)
}

// kill sends SIGKILL and waits until the process is gone. A process that had already
// exited on its own is a failure: the system must not fall over before the fault.
func (p *process) kill(t *testing.T) {
	t.Helper()
	require.NotNil(t, p.cmd, "%s is not running", p.name)
	select {
	case err := <-p.done:
		p.cmd = nil
		t.Fatalf("%s had exited on its own before it was killed: %v", p.name, err)
	default:
	}
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.done
	fmt.Fprintf(p.file, "==== killed %s\n", time.Now().Format(time.RFC3339Nano))
	p.cmd = nil
}

// alive fails the test if the process has exited.
func (p *process) alive(t *testing.T) {
	t.Helper()
	select {
	case err := <-p.done:
		p.cmd = nil
		t.Fatalf("%s exited: %v", p.name, err)
	default:
	}
}

func (p *process) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
	p.cmd = nil
}
