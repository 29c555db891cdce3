package squidtest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
)

// Boot runs a VM's boot script (squid.InstanceScript, as a cloud's user data or startup
// script carries it) the way the instance runs it, then runs real Squid on what the script
// wrote, on host (loopback) at the script's port instead of every interface. The script runs in a directory of
// its own (PROXYFLEET_ROOT), with apt-get, systemctl and chgrp stubbed; the paths it wrote
// are moved to TempPaths. So a test probes, and crawls through, the very configuration an
// instance boots with. It may be called from any goroutine (a fake cloud booting a VM):
// it returns errors rather than failing t.
func Boot(t testing.TB, script []byte, host string) (*Instance, error) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "squidtest-root-")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	stubs := filepath.Join(root, "stubs")
	if err := os.Mkdir(stubs, 0o755); err != nil {
		return nil, err
	}
	for _, name := range []string{"apt-get", "systemctl", "chgrp"} {
		if err := os.WriteFile(filepath.Join(stubs, name), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(bash, "-c", string(script))
	cmd.Env = append(os.Environ(), "PROXYFLEET_ROOT="+root, "PATH="+stubs+string(os.PathListSeparator)+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("boot script: %w\n%s", err, out)
	}
	def := squid.DefaultPaths
	conf, err := os.ReadFile(filepath.Join(root, def.Conf))
	if err != nil {
		return nil, fmt.Errorf("the boot script wrote no squid.conf: %w", err)
	}
	passwd, err := os.ReadFile(filepath.Join(root, def.Passwd))
	if err != nil {
		return nil, fmt.Errorf("the boot script wrote no passwd file: %w", err)
	}
	// The instance listens on every interface at its port; here, on host alone.
	listen := regexp.MustCompile(`(?m)^http_port ([0-9]+)$`)
	m := listen.FindSubmatch(conf)
	if m == nil {
		return nil, errors.New("the boot script's squid.conf has no http_port")
	}
	addr := net.JoinHostPort(host, string(m[1]))
	conf = listen.ReplaceAll(conf, []byte("http_port "+addr))
	paths := TempPaths(t)
	for _, r := range [][2]string{{def.Passwd, paths.Passwd}, {def.PidFile, paths.PidFile}, {def.CacheLog, paths.CacheLog}, {def.AuthHelper, paths.AuthHelper}} {
		conf = bytes.ReplaceAll(conf, []byte(r[0]), []byte(r[1]))
	}
	inst, err := run(t, squid.Files{Conf: conf, Passwd: passwd, Paths: paths}, addr)
	if err != nil {
		return nil, err
	}
	inst.Root = root
	return inst, nil
}
