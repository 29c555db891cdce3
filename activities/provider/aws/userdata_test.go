package aws_test

import (
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid/squidtest"
)

// TestTheUserDataBootsASquidSquidAccepts: the user data the provider sends, run as the
// instance would run it (in a directory of its own, with apt-get and systemctl stubbed),
// writes a squid.conf that real Squid parses, a passwd file with the password's hash and
// not the password, and then runs the Proxy's own cloud-init script.
func TestTheUserDataBootsASquidSquidAccepts(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	_, err = p.Create(context.Background(), request("px-abc-1", "uid-1"))
	require.NoError(t, err)
	script, err := base64.StdEncoding.DecodeString(s.Instances()[0].UserData)
	require.NoError(t, err)

	root, stubs := t.TempDir(), t.TempDir()
	for _, name := range []string{"apt-get", "systemctl", "chgrp"} {
		require.NoError(t, os.WriteFile(filepath.Join(stubs, name), []byte("#!/bin/sh\nexit 0\n"), 0o755))
	}
	cmd := exec.Command(bash, "-c", string(script))
	cmd.Env = append(os.Environ(), "PROXYFLEET_ROOT="+root, "PATH="+stubs+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "user", "the Proxy's own script ran after Squid was set up")

	conf, err := os.ReadFile(filepath.Join(root, "etc/squid/squid.conf"))
	require.NoError(t, err)
	assert.Contains(t, string(conf), "http_port 3128")
	squidtest.Parse(t, conf)
	passwd, err := os.ReadFile(filepath.Join(root, "etc/squid/passwd"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(passwd), "proxyfleet:"), "%s", passwd)
	assert.NotContains(t, string(passwd), password)
}
