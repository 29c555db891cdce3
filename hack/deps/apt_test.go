package deps

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// world is a machine for apt.sh: stand-ins on PATH record their calls in a log. dpkg-query
// reports a package installed once apt-get has "installed" it; apt-get fails to install
// until its lists were updated, when the lists start out missing; its every call records
// what policy-rc.d answered at that moment.
type world struct {
	dir, stubs, policy string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	w := &world{dir: t.TempDir()}
	w.stubs = filepath.Join(w.dir, "bin")
	w.policy = filepath.Join(w.dir, "policy-rc.d")
	require.NoError(t, os.Mkdir(w.stubs, 0o755))
	stub := func(name, body string) {
		require.NoError(t, os.WriteFile(filepath.Join(w.stubs, name), []byte("#!/bin/sh\nW="+w.dir+"\n"+body), 0o755))
	}
	stub("dpkg-query", `pkg=$(eval echo \${$#})
if [ -e "$W/installed-$pkg" ]; then printf installed; else printf not-installed; fi
`)
	stub("id", `echo "${FAKE_UID:-0}"`)
	stub("apt-get", `echo "apt-get $*" >>"$W/calls"
if [ -x "$W/policy-rc.d" ]; then "$W/policy-rc.d" squid start; echo "policy $?" >>"$W/calls"; fi
case "$1" in
update) touch "$W/updated" ;;
install)
	if [ -e "$W/broken" ]; then echo "E: dpkg was interrupted"; exit 100; fi
	if [ -e "$W/no-lists" ] && [ ! -e "$W/updated" ]; then echo "E: Unable to locate package squid"; exit 100; fi
	for a in "$@"; do case "$a" in -*|install) ;; *) touch "$W/installed-$a" ;; esac; done ;;
esac
`)
	return w
}

func (w *world) touch(t *testing.T, name string) {
	require.NoError(t, os.WriteFile(filepath.Join(w.dir, name), nil, 0o644))
}

func (w *world) run(t *testing.T, env ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", "apt.sh")
	cmd.Env = append(os.Environ(), "PATH="+w.stubs+string(os.PathListSeparator)+os.Getenv("PATH"), "PROXYFLEET_POLICY_RC_D="+w.policy)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (w *world) calls(t *testing.T) []string {
	b, err := os.ReadFile(filepath.Join(w.dir, "calls"))
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

const install = "apt-get install -y --no-install-recommends squid python3-scrapy python3-pytest"

func TestNothingMissing(t *testing.T) {
	w := newWorld(t)
	for _, p := range []string{"squid", "python3-scrapy", "python3-pytest"} {
		w.touch(t, "installed-"+p)
	}
	out, err := w.run(t, "FAKE_UID=1000")
	require.NoError(t, err, out)
	assert.Empty(t, w.calls(t))
}

func TestInstallsWithoutStartingServices(t *testing.T) {
	w := newWorld(t)
	w.touch(t, "no-lists")
	out, err := w.run(t)
	require.NoError(t, err, out)
	assert.Equal(t, []string{install, "policy 101", "apt-get update", "policy 101", install, "policy 101"}, w.calls(t),
		"the lists are updated after an install failed for want of them; no service may start meanwhile")
	assert.NoFileExists(t, w.policy, "policy-rc.d is removed afterwards")
	assert.FileExists(t, filepath.Join(w.dir, "installed-squid"))
}

func TestNoUpdateWhenListsAreThere(t *testing.T) {
	w := newWorld(t)
	out, err := w.run(t)
	require.NoError(t, err, out)
	assert.Equal(t, []string{install, "policy 101"}, w.calls(t))
}

func TestRestoresPolicy(t *testing.T) {
	w := newWorld(t)
	require.NoError(t, os.WriteFile(w.policy, []byte("#!/bin/sh\nexit 0\n"), 0o700))
	out, err := w.run(t)
	require.NoError(t, err, out)
	b, err := os.ReadFile(w.policy)
	require.NoError(t, err)
	assert.Equal(t, "#!/bin/sh\nexit 0\n", string(b), "the machine's own policy-rc.d is back")
	st, err := os.Stat(w.policy)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	assert.Equal(t, []string{install, "policy 101"}, w.calls(t))
}

func TestOtherFailuresAreNotRetried(t *testing.T) {
	w := newWorld(t)
	w.touch(t, "broken")
	out, err := w.run(t)
	require.Error(t, err)
	assert.Contains(t, out, "dpkg was interrupted")
	assert.Equal(t, []string{install, "policy 101"}, w.calls(t))
	assert.NoFileExists(t, w.policy)
}

func TestNotRootPrintsTheCommand(t *testing.T) {
	w := newWorld(t)
	out, err := w.run(t, "FAKE_UID=1000")
	require.Error(t, err)
	abs, aerr := filepath.Abs("apt.sh")
	require.NoError(t, aerr)
	assert.Contains(t, out, "sudo "+abs)
	assert.Contains(t, out, "squid")
	assert.Empty(t, w.calls(t))
}
