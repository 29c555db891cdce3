package testenv

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPortsHandedOutAreReservedAcrossProcesses: a port FreePorts hands out is not handed
// out again, neither in this process nor in another one (run here as flock(1), which
// takes the same lock another test process's FreePorts would), until the process that
// holds it exits. Without the reservation two servers of suites running side by side were
// given one port, and one answered the other's clients.
func TestPortsHandedOutAreReservedAcrossProcesses(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("needs flock(1)")
	}
	ports, err := FreePorts(1)
	require.NoError(t, err)
	p := ports[0]
	require.False(t, reserve(p), "a port is handed out once in a process")
	lockFile := func(port int) string {
		return filepath.Join(os.TempDir(), "proxyfleet-test-ports", strconv.Itoa(port))
	}
	out, err := exec.Command("flock", "--nonblock", lockFile(p), "true").CombinedOutput()
	require.Error(t, err, "another process cannot take the port this one was handed: %s", out)

	// A port another process holds is not handed to this one, and is once that process
	// has exited.
	// flock(1) holds the lock of a port this process has not been handed (the first such
	// port no other process holds either) until its stdin closes.
	var (
		q     int
		stdin io.WriteCloser
		child *exec.Cmd
	)
	for c := p + 1; c < p+1000 && q == 0; c++ {
		reserved.Lock()
		_, mine := reserved.files[c]
		reserved.Unlock()
		if mine {
			continue
		}
		child = exec.Command("flock", "--nonblock", lockFile(c), "sh", "-c", "echo locked; cat")
		stdin, err = child.StdinPipe()
		require.NoError(t, err)
		stdout, err := child.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, child.Start())
		if line, _ := bufio.NewReader(stdout).ReadString('\n'); line == "locked\n" {
			q = c
			break
		}
		_ = child.Wait() // another process holds this one
	}
	require.NotZero(t, q, "no port's lock could be taken by flock(1)")
	require.False(t, reserve(q), "a port another process holds")
	require.NoError(t, stdin.Close())
	require.NoError(t, child.Wait())
	require.True(t, reserve(q), "a port whose holder exited")
}
