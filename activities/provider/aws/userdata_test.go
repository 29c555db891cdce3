package aws_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid/squidtest"
)

// TestTheUserDataBootsASquidSquidAccepts: the user data the provider sends, run as the
// instance would run it (squidtest.Boot: in a directory of its own, with apt-get and
// systemctl stubbed), writes a squid.conf that real Squid runs, a passwd file with the
// password's hash and not the password, and then runs the Proxy's own cloud-init script.
func TestTheUserDataBootsASquidSquidAccepts(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	req := request("px-abc-1", "uid-1")
	req.Port = squidtest.FreePort(t) // Squid listens there, on loopback
	req.CloudInit = []byte("#!/bin/sh\necho user >\"$PROXYFLEET_ROOT/user-ran\"\n")
	_, err := p.Create(context.Background(), req)
	require.NoError(t, err)
	script, err := base64.StdEncoding.DecodeString(s.Instances()[0].UserData)
	require.NoError(t, err)

	sq, err := squidtest.Boot(t, script, "127.0.0.1")
	require.NoError(t, err, "real Squid runs what the user data wrote")
	ran, err := os.ReadFile(filepath.Join(sq.Root, "user-ran"))
	require.NoError(t, err, "the Proxy's own script ran after Squid was set up")
	assert.Equal(t, "user\n", string(ran))
	conf, err := os.ReadFile(filepath.Join(sq.Root, "etc/squid/squid.conf"))
	require.NoError(t, err)
	assert.Contains(t, string(conf), fmt.Sprintf("http_port %d\n", req.Port), "every interface of the instance")
	passwd, err := os.ReadFile(filepath.Join(sq.Root, "etc/squid/passwd"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(passwd), "proxyfleet:"), "%s", passwd)
	assert.NotContains(t, string(passwd), password)
}
