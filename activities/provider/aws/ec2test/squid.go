package ec2test

import (
	"encoding/base64"
	"testing"

	"github.com/proxyfleet/proxyfleet/activities/provider/squid/squidtest"
)

// BootSquid makes the fake's instances boot as the aws provider's instances do: each runs
// its user data, and then real Squid runs on what that wrote, on 127.0.0.1 at its port
// (squidtest.Boot), until EC2 terminates, stops or interrupts it. booted, when not nil, is
// told each instance's ID and the directory its user data ran in. Call it before the
// first request.
func (s *Server) BootSquid(t testing.TB, booted func(id, root string)) {
	s.Boot = func(in Instance) (string, func(), error) {
		script, err := base64.StdEncoding.DecodeString(in.UserData)
		if err != nil {
			return "", nil, err
		}
		sq, err := squidtest.Boot(t, script, "127.0.0.1")
		if err != nil {
			return "", nil, err
		}
		if booted != nil {
			booted(in.ID, sq.Root)
		}
		return "127.0.0.1", sq.Stop, nil
	}
}
