package squid

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostile is a user script (valid, and harmless when run) that would end a heredoc early or
// break out of naive quoting if it were embedded as text.
var hostile = []byte("#!/bin/sh\n: <<'" + heredocEnd + "'\n" +
	"'\"$(touch \"$PROXYFLEET_ROOT/escaped\")`touch \"$PROXYFLEET_ROOT/escaped\"`\n" +
	heredocEnd + "\necho ran >\"$PROXYFLEET_ROOT/ran\"\n")

func bashPath(t *testing.T) string {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash is not installed")
	}
	return bash
}

// embedded are the files a startup script stores: path (without $root) to decoded content.
func embedded(t *testing.T, script []byte) map[string]embeddedFile {
	t.Helper()
	out := map[string]embeddedFile{}
	sc := bufio.NewScanner(bytes.NewReader(script))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 5 || fields[0] != "put" {
			continue
		}
		require.Equal(t, "<<'"+heredocEnd+"'", fields[4])
		var enc strings.Builder
		for sc.Scan() && sc.Text() != heredocEnd {
			enc.WriteString(sc.Text())
		}
		data, err := base64.StdEncoding.DecodeString(enc.String())
		require.NoError(t, err)
		path := strings.Trim(strings.TrimPrefix(fields[1], `"$root"`), "'")
		out[path] = embeddedFile{mode: fields[2], group: strings.Trim(fields[3], "'"), data: data}
	}
	require.NoError(t, sc.Err())
	return out
}

type embeddedFile struct {
	mode, group string
	data        []byte
}

func TestStartupScriptEmbedsTheRendering(t *testing.T) {
	f, err := Render(Config{Port: 3128, Credentials: testCreds})
	require.NoError(t, err)
	script, err := StartupScript(f, hostile)
	require.NoError(t, err)

	out, err := exec.Command(bashPath(t), "-n", "-c", string(script)).CombinedOutput()
	require.NoError(t, err, "bash -n: %s", out)

	files := embedded(t, script)
	assert.Equal(t, map[string]embeddedFile{
		"/etc/squid/squid.conf":           {mode: "0644", data: f.Conf},
		"/etc/squid/passwd":               {mode: "0640", group: "proxy", data: f.Passwd},
		"/var/lib/proxyfleet/user-script": {mode: "0700", data: hostile},
	}, files)
	assert.NotContains(t, string(script), testCreds.Password)

	again, err := StartupScript(f, hostile)
	require.NoError(t, err)
	assert.Equal(t, script, again, "deterministic")

	noUser, err := StartupScript(f, nil)
	require.NoError(t, err)
	assert.NotContains(t, string(noUser), UserScriptPath)

	_, err = StartupScript(Files{}, nil)
	assert.Error(t, err, "an empty rendering")
}

// TestStartupScriptRuns runs the script against a directory (PROXYFLEET_ROOT) with stand-ins
// for apt-get, systemctl and chgrp on PATH, which record their arguments. The stand-in
// apt-get fails to install until the package lists were updated, as on a fresh image.
func TestStartupScriptRuns(t *testing.T) {
	bash := bashPath(t)
	f, err := Render(Config{Port: 3128, Credentials: testCreds})
	require.NoError(t, err)

	stubs := t.TempDir()
	stub := func(name, body string) {
		require.NoError(t, os.WriteFile(filepath.Join(stubs, name),
			[]byte("#!/bin/sh\necho \""+name+" $*\" >>\"$PROXYFLEET_ROOT/calls\"\n"+body), 0o755))
	}
	stub("apt-get", `case "$*" in
*" update") touch "$PROXYFLEET_ROOT/updated" ;;
*" install "*) [ -e "$PROXYFLEET_ROOT/updated" ] || exit 100 ;;
esac
`)
	stub("systemctl", "")
	stub("chgrp", "")

	run := func(t *testing.T, root string, user []byte) (string, error) {
		script, err := StartupScript(f, user)
		require.NoError(t, err)
		cmd := exec.Command(bash, "-c", string(script))
		cmd.Env = append(os.Environ(), "PROXYFLEET_ROOT="+root, "PATH="+stubs+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	calls := func(t *testing.T, root string) []string {
		b, err := os.ReadFile(filepath.Join(root, "calls"))
		require.NoError(t, err)
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	mode := func(t *testing.T, path string) os.FileMode {
		st, err := os.Stat(path)
		require.NoError(t, err)
		return st.Mode().Perm()
	}

	t.Run("fresh image", func(t *testing.T) {
		root := t.TempDir()
		out, err := run(t, root, hostile)
		require.NoError(t, err, out)

		conf := filepath.Join(root, "etc/squid/squid.conf")
		passwd := filepath.Join(root, "etc/squid/passwd")
		assertFile(t, conf, f.Conf)
		assertFile(t, passwd, f.Passwd)
		assert.Equal(t, os.FileMode(0o644), mode(t, conf))
		assert.Equal(t, os.FileMode(0o640), mode(t, passwd))
		assert.Equal(t, os.FileMode(0o700), mode(t, filepath.Join(root, UserScriptPath)))
		assert.FileExists(t, filepath.Join(root, "ran"), "the user script ran")
		assert.NoFileExists(t, filepath.Join(root, "escaped"), "nothing in the user script ran as part of the startup script")

		opts := "-o DPkg::Lock::Timeout=600"
		assert.Equal(t, []string{
			"apt-get " + opts + " install -y --no-install-recommends squid",
			"apt-get " + opts + " update",
			"apt-get " + opts + " install -y --no-install-recommends squid",
			"chgrp proxy " + passwd + ".", // a temporary name beside it, renamed over it
			"systemctl enable squid",
			"systemctl restart squid",
		}, trimTemp(calls(t, root), passwd))
	})

	t.Run("next boot", func(t *testing.T) {
		root := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(root, "usr/sbin"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, "usr/sbin/squid"), nil, 0o755))
		require.NoError(t, os.MkdirAll(filepath.Join(root, "etc/squid"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, "etc/squid/squid.conf"), []byte("old"), 0o644))

		out, err := run(t, root, []byte("#!/bin/sh\nexit 3\n"))
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "the user script's failure is the script's: %v %s", err, out)
		assert.Equal(t, 3, exit.ExitCode())

		assertFile(t, filepath.Join(root, "etc/squid/squid.conf"), f.Conf)
		for _, c := range calls(t, root) {
			assert.NotContains(t, c, "apt-get", "Squid is installed")
		}
		leftovers, err := filepath.Glob(filepath.Join(root, "etc/squid/*.*"))
		require.NoError(t, err)
		assert.Equal(t, []string{filepath.Join(root, "etc/squid/squid.conf")}, leftovers, "no temporary files stay")
	})
}

func assertFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got), path)
}

// trimTemp cuts the random suffix of temporary files named after path.
func trimTemp(calls []string, path string) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		if j := strings.Index(c, path+"."); j >= 0 {
			c = c[:j+len(path)+1]
		}
		out[i] = c
	}
	return out
}
