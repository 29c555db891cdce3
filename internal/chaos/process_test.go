//go:build chaos

package chaos

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// process is one of the system's binaries, run with the same command line every time it
// is started, with the suite's assertions on it.
type process struct{ *testenv.Process }

func newProcess(t *testing.T, name string, env []string, args ...string) *process {
	t.Helper()
	return &process{testenv.LoggedProcess(t, name, testenv.Command(t, name), env, args...)}
}

func (p *process) start(t *testing.T) {
	t.Helper()
	require.NoError(t, p.Start())
}

// kill sends SIGKILL and waits until the process is gone. A process that had already
// exited on its own is a failure: the system must not fall over before the fault.
func (p *process) kill(t *testing.T) {
	t.Helper()
	p.alive(t)
	require.NoError(t, p.Kill())
}

// alive fails the test if the process has exited.
func (p *process) alive(t *testing.T) {
	t.Helper()
	if running, err := p.Running(); !running {
		t.Fatalf("%s is not running: %v", p.Name, err)
	}
}
