// Package squidtest runs the real Squid installed on the machine for tests: a
// configuration rendered by package squid, on a free port of 127.0.0.1, with its files in a
// directory of its own, stopped when the test ends. It works unprivileged (a developer) and
// as root (CI), where Squid switches to its own user (proxy) and so needs the directory
// open to it.
//
// A missing Squid fails the test with the command that installs it; it is never a reason
// to skip, or the tests that prove the proxies' rules would pass without running.
//
// squid.DefaultDenied refuses loopback, so a test that reaches a server on 127.0.0.1
// through Squid sets Config.Denied to an empty slice, or Config.Allowed to that address.
package squidtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// InstallHint is how to install what these tests need.
const InstallHint = "install it with `make deps` (as root, or it prints the command to run with sudo); " +
	"on Debian and Ubuntu that is the squid package"

// startTimeout bounds how long Squid may take to accept connections; it takes well under a
// second on an idle machine.
const startTimeout = 30 * time.Second

// testOnly is appended to every configuration the package runs. Squid resolves names
// through the machine's resolvers; a test must not send anything beyond loopback, even if
// a test asks for a name by mistake, so the only resolver is loopback (where nothing
// answers, and /etc/hosts still resolves localhost).
const testOnly = "\n# squidtest: never ask a resolver beyond this machine.\ndns_nameservers 127.0.0.1\n"

// Binary is the path of the squid program, or fails t saying how to install it.
func Binary(t testing.TB) string {
	t.Helper()
	p, err := findBinary(exec.LookPath, sbinDirs)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sbinDirs are searched after PATH: an unprivileged user's PATH on Debian has no sbin.
var sbinDirs = []string{"/usr/sbin", "/usr/local/sbin"}

func findBinary(lookPath func(string) (string, error), dirs []string) (string, error) {
	if p, err := lookPath("squid"); err == nil {
		return p, nil
	}
	for _, d := range dirs {
		p := filepath.Join(d, "squid")
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("squid is not installed (looked on PATH and in %s): %s", strings.Join(dirs, ", "), InstallHint)
}

// TempPaths are squid.Paths in a new directory, removed when the test ends, that Squid can
// use whether the test runs as root or not.
func TempPaths(t testing.TB) squid.Paths {
	t.Helper()
	helper := squid.DefaultPaths.AuthHelper
	if _, err := os.Stat(helper); err != nil {
		t.Fatalf("Squid's authentication helper %s is missing: %s", helper, InstallHint)
	}
	parent := os.TempDir()
	if os.Geteuid() == 0 {
		// Root's TMPDIR may sit in a directory Squid's user cannot enter; /tmp never does.
		parent = "/tmp"
	}
	dir, err := os.MkdirTemp(parent, "squidtest-")
	if err != nil {
		t.Fatalf("squidtest: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Squid reads the files here and writes its log and pid file. As root it does that as
	// its own user (proxy), which owns nothing here: the directory is then open to all,
	// with the sticky bit, like /tmp itself.
	mode := os.FileMode(0o755)
	if os.Geteuid() == 0 {
		mode = 0o777 | os.ModeSticky
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatalf("squidtest: %v", err)
	}
	return squid.Paths{
		Conf:       filepath.Join(dir, "squid.conf"),
		Passwd:     filepath.Join(dir, "passwd"),
		AuthHelper: helper,
		PidFile:    filepath.Join(dir, "squid.pid"),
		CacheLog:   filepath.Join(dir, "cache.log"),
	}
}

// FreePort is a TCP port of 127.0.0.1 that nothing listens on now, reserved for the caller
// until Squid binds it (testenv.FreePorts).
func FreePort(t testing.TB) int32 {
	t.Helper()
	p, err := testenv.FreePorts(1)
	if err != nil {
		t.Fatalf("squidtest: %v", err)
	}
	return int32(p[0])
}

// Instance is a running Squid.
type Instance struct {
	// Addr is the host:port Squid listens on.
	Addr string
	// Files are what it runs.
	Files squid.Files
	// Root is the directory a boot script ran in (Boot; empty otherwise): what it wrote
	// as the instance's files, under their paths.
	Root string

	cmd     *exec.Cmd
	name    string // the service name (-n)
	output  string // Squid's standard output and error
	done    chan struct{}
	waitErr error
}

// Start renders c and runs it: Listen is 127.0.0.1, Port a free port, and Paths
// TempPaths(t) unless c sets them. Squid is stopped when the test ends.
func Start(t testing.TB, c squid.Config) *Instance {
	t.Helper()
	if c.Listen != "" && c.Listen != "127.0.0.1" {
		t.Fatalf("squidtest: Listen %q: tests listen on 127.0.0.1 only", c.Listen)
	}
	c.Listen = "127.0.0.1"
	if c.Paths == (squid.Paths{}) {
		c.Paths = TempPaths(t)
	}
	fixedPort := c.Port != 0
	// A free port can be taken by another process before Squid binds it; then Squid exits
	// at once and another port is tried.
	for attempt := 1; ; attempt++ {
		if !fixedPort {
			c.Port = FreePort(t)
		}
		files, err := squid.Render(c)
		if err != nil {
			t.Fatalf("squidtest: %v", err)
		}
		inst, err := run(t, files, net.JoinHostPort(c.Listen, strconv.Itoa(int(c.Port))))
		if err == nil {
			return inst
		}
		if fixedPort || attempt == 3 || !strings.Contains(err.Error(), "Address already in use") {
			t.Fatalf("squidtest: %v", err)
		}
	}
}

// Run runs Squid on files, written to their paths (with the resolver line testOnly
// describes), and waits until it accepts connections at addr, which must be the http_port
// of files.Conf. Squid is stopped when the test ends.
func Run(t testing.TB, files squid.Files, addr string) *Instance {
	t.Helper()
	inst, err := run(t, files, addr)
	if err != nil {
		t.Fatalf("squidtest: %v", err)
	}
	return inst
}

func run(t testing.TB, files squid.Files, addr string) (*Instance, error) {
	t.Helper()
	bin := Binary(t)
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("address %s: tests listen on loopback only", addr)
	}
	p := files.Paths
	if p.Conf == "" || p.Passwd == "" || p.CacheLog == "" {
		return nil, errors.New("files carry no paths: render them with squid.Render")
	}
	conf := append(bytes.Clone(files.Conf), testOnly...)
	if err := os.WriteFile(p.Conf, conf, 0o644); err != nil {
		return nil, err
	}
	// Readable by Squid's helper whatever user it runs as; the credentials are a test's.
	if err := os.WriteFile(p.Passwd, files.Passwd, 0o644); err != nil {
		return nil, err
	}
	output := filepath.Join(filepath.Dir(p.Conf), "squid.out")
	out, err := os.OpenFile(output, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	defer func() { _ = out.Close() }()

	// -N: in the foreground, one process, no daemon to lose track of. -n: Squid names its
	// shared memory segments (/dev/shm/NAME-*) after the service, so instances running at
	// once, or a root's and a user's, must not share a name.
	name := serviceName(filepath.Dir(p.Conf))
	cmd := exec.Command(bin, "-N", "-n", name, "-f", p.Conf)
	cmd.Dir = filepath.Dir(p.Conf)
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so stopping it also stops the helpers it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	inst := &Instance{Addr: addr, Files: files, cmd: cmd, name: name, output: output, done: make(chan struct{})}
	go func() {
		inst.waitErr = cmd.Wait()
		close(inst.done)
	}()
	t.Cleanup(func() {
		inst.Stop()
		if t.Failed() {
			t.Logf("squid at %s:\n%s", addr, inst.Logs())
		}
	})

	if err := inst.waitReady(); err != nil {
		inst.Stop()
		return nil, fmt.Errorf("%w\n%s", err, inst.Logs())
	}
	return inst, nil
}

// waitReady waits until Squid accepts a connection, exits, or startTimeout passes.
func (i *Instance) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var d net.Dialer
	for {
		dctx, dcancel := context.WithTimeout(ctx, time.Second)
		c, err := d.DialContext(dctx, "tcp", i.Addr)
		dcancel()
		if err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-i.done:
			return fmt.Errorf("squid exited before accepting connections at %s: %v", i.Addr, i.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("squid did not accept connections at %s within %s", i.Addr, startTimeout)
		case <-tick.C:
		}
	}
}

// Pid is the process ID of Squid's main process (a benchmark pins it to a core).
func (i *Instance) Pid() int { return i.cmd.Process.Pid }

// Stop kills Squid and its helpers and waits for Squid to exit. It is safe to call more
// than once; the test's cleanup calls it too.
func (i *Instance) Stop() {
	select {
	case <-i.done:
		return
	default:
	}
	// Killed, not shut down: even Squid's quickest shutdown (SIGINT) takes two seconds, and
	// a test has nothing to drain. The whole process group goes, helpers included; what
	// Squid would have removed on the way out is removed here.
	_ = syscall.Kill(-i.cmd.Process.Pid, syscall.SIGKILL)
	<-i.done
	leftovers, _ := filepath.Glob("/dev/shm/" + i.name + "-*")
	for _, f := range leftovers {
		_ = os.Remove(f)
	}
}

// serviceName is a Squid service name (alphanumeric, at most 32 characters) unique to dir:
// its name's letters and digits, which for TempPaths end in MkdirTemp's random digits.
func serviceName(dir string) string {
	var b strings.Builder
	for _, r := range "sq" + filepath.Base(dir) {
		if r < 0x80 && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			b.WriteRune(r)
		}
	}
	s := b.String()
	return s[max(0, len(s)-32):]
}

// Logs are Squid's output and its cache.log, for a failure message.
func (i *Instance) Logs() string {
	var b strings.Builder
	for _, f := range []string{i.output, i.Files.Paths.CacheLog} {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
			continue
		}
		fmt.Fprintf(&b, "--- %s\n%s", f, data)
	}
	return b.String()
}

// Parse runs `squid -k parse` on conf and returns its output; a configuration Squid
// refuses fails t with that output.
func Parse(t testing.TB, conf []byte) string {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	f := filepath.Join(dir, "squid.conf")
	if err := os.WriteFile(f, conf, 0o644); err != nil {
		t.Fatalf("squidtest: %v", err)
	}
	out, err := exec.Command(bin, "-k", "parse", "-f", f).CombinedOutput()
	if err != nil {
		t.Fatalf("squid -k parse refused the configuration: %v\n%s\n--- configuration:\n%s", err, out, conf)
	}
	return string(out)
}
