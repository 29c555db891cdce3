package tools

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nestedEnv marks the make run this test starts, so that run cannot start it again.
const nestedEnv = "PROXYFLEET_FIRST_RUN_TEST"

// TestFreshCloneBuildsItsTools: `make test` on a fresh clone, with nothing in bin/ and an
// empty tool cache, builds every pinned tool and gets past the steps that use them (the
// generated-files check runs controller-gen). The packages it tests are narrowed to one
// small package: the point is the set-up, which the real target does in full. The cache is
// a temporary directory (PROXYFLEET_TOOLS_CACHE), so the machine's warm cache is untouched;
// with a warm Go build cache the tools are relinked, not recompiled.
func TestFreshCloneBuildsItsTools(t *testing.T) {
	if os.Getenv(nestedEnv) != "" {
		t.Skip("inside the make run this test started")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	clone := freshClone(t)
	// Resolved, so it compares with the resolved links below where the temporary directory
	// sits behind a symlink.
	cache, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	require.NoDirExists(t, filepath.Join(clone, "bin"), "a fresh clone has no tools")

	cmd := exec.Command("make", "test",
		"PKGS=./internal/cmdline", "E2E_PKG=./internal/cmdline",
		"TEST_FLAGS=-count=1 -run=^$$", "E2E_FLAGS=-count=1 -run=^$$")
	cmd.Dir = clone
	cmd.Env = append(freshEnv(), "PROXYFLEET_TOOLS_CACHE="+cache, nestedEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "make test on a fresh clone failed:\n%s", out)

	for _, tool := range []string{"temporal", "k8s/etcd", "k8s/kube-apiserver", "k8s/kubectl", "controller-gen", "workflowcheck", "staticcheck"} {
		name := filepath.Base(tool)
		assert.Contains(t, string(out), ">> built "+name+" ", "make test did not build %s", name)
		target, err := filepath.EvalSymlinks(filepath.Join(clone, "bin", tool))
		if assert.NoError(t, err, "bin/%s", tool) {
			assert.True(t, strings.HasPrefix(target, cache+string(filepath.Separator)),
				"bin/%s points at %s, outside the tool cache it was given", tool, target)
		}
	}
	ver, err := exec.Command(filepath.Join(clone, "bin", "temporal"), "--version").CombinedOutput()
	require.NoError(t, err, "%s", ver)
	assert.Contains(t, string(ver), "1.5.1", "the pinned temporal CLI")
}

// TestEveryToolUserBuildsTools: each make target that runs a pinned tool, or tests that
// start one, installs the tools first. `make -n` shows the order without running anything;
// TestFreshCloneBuildsItsTools runs the real thing for `make test`.
func TestEveryToolUserBuildsTools(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skip("not in a git checkout")
	}
	// check-generated is left out: its recipe runs a sub-make, which `make -n` executes;
	// test and lint cover it as a prerequisite.
	for _, target := range []string{"test", "lint", "generate", "bench", "chaos", "test-e2e", "dev", "record-histories"} {
		t.Run(target, func(t *testing.T) {
			cmd := exec.Command("make", "-n", target)
			cmd.Dir = strings.TrimSpace(string(top))
			cmd.Env = freshEnv()
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			install := strings.Index(string(out), "hack/tools/install.sh")
			require.GreaterOrEqual(t, install, 0, "make %s does not install the tools:\n%s", target, out)
			for _, use := range []string{"/bin/controller-gen", "/bin/staticcheck", "/bin/workflowcheck", "go test", "/bin/devstack"} {
				if i := strings.Index(string(out), use); i >= 0 {
					assert.Less(t, install, i, "make %s runs %s before it installs the tools", target, use)
				}
			}
		})
	}
}

// freshEnv is this process's environment without what an enclosing make passes down
// (jobserver, flags, command-line variables such as GO=), which a new user's run lacks.
func freshEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch name, _, _ := strings.Cut(kv, "="); name {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", nestedEnv:
		default:
			env = append(env, kv)
		}
	}
	return env
}

// freshClone copies the files git tracks, as they are in the working tree (so uncommitted
// changes to the Makefile are what is tested), into a new directory: what `git clone` of
// this state would give, without the untracked bin/, caches and build output.
func freshClone(t *testing.T) string {
	t.Helper()
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skip("not in a git checkout")
	}
	root := strings.TrimSpace(string(top))
	files, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	require.NoError(t, err)
	dst := t.TempDir()
	for _, f := range strings.Split(strings.TrimRight(string(files), "\x00"), "\x00") {
		src := filepath.Join(root, f)
		info, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the working tree, not yet committed
		}
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dst, f)), 0o755))
		if info.Mode()&fs.ModeSymlink != 0 {
			link, err := os.Readlink(src)
			require.NoError(t, err)
			require.NoError(t, os.Symlink(link, filepath.Join(dst, f)))
			continue
		}
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, f), b, info.Mode().Perm()))
	}
	return dst
}
