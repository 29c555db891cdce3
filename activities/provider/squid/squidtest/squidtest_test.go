package squidtest

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

func TestMissingSquidSaysHowToInstallIt(t *testing.T) {
	notFound := func(string) (string, error) { return "", errors.New("not found") }
	_, err := findBinary(notFound, []string{t.TempDir()})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "make deps")

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "squid"), nil, 0o755))
	p, err := findBinary(notFound, []string{t.TempDir(), dir})
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "squid"), p, "found outside PATH")
}

// TestStartAndStop: Start gives a Squid that accepts connections; Stop leaves nothing of it
// running, helpers included.
func TestStartAndStop(t *testing.T) {
	sq := Start(t, squid.Config{
		Credentials: proxyauth.Credentials{Username: "u", Password: "p"},
		Denied:      []netip.Prefix{},
	})
	c, err := net.DialTimeout("tcp", sq.Addr, 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	assert.FileExists(t, sq.Files.Paths.CacheLog, "Squid could write its log")

	pgid := sq.cmd.Process.Pid
	sq.Stop()
	sq.Stop() // a second call, as the cleanup makes, is harmless
	// The helpers were killed with Squid; they are gone once init has reaped them.
	assert.Eventually(t, func() bool { return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) },
		10*time.Second, 10*time.Millisecond, "a process of Squid's group is left")
	_, err = net.DialTimeout("tcp", sq.Addr, 5*time.Second)
	assert.Error(t, err, "still listening")
	shm, err := filepath.Glob("/dev/shm/" + sq.name + "-*")
	require.NoError(t, err)
	assert.Empty(t, shm, "Squid's shared memory is left behind")
}
