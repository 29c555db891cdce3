package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestAuthFailsClosed: discovery hands out proxy credentials, so an empty token never
// opens it by accident; only --insecure-no-auth on loopback does. A token and a clients
// file together are refused rather than one silently ignored.
func TestAuthFailsClosed(t *testing.T) {
	for _, tc := range []struct {
		token    string
		clients  string // --clients-file
		insecure bool
		listen   string
		want     string // "" when allowed
	}{
		{"secret", "", false, "0.0.0.0:8090", ""},
		{"", "", false, "127.0.0.1:8090", "DISCOVERY_TOKEN is empty"},
		{"", "", false, "0.0.0.0:8090", "DISCOVERY_TOKEN is empty"},
		{"", "", true, "127.0.0.1:8090", ""},
		{"", "", true, "[::1]:8090", ""},
		{"", "", true, "localhost:8090", ""},
		{"", "", true, "0.0.0.0:8090", "allowed only on a loopback address"},
		{"", "", true, ":8090", "allowed only on a loopback address"},
		{"", "", true, "10.0.0.5:8090", "allowed only on a loopback address"},
		{"secret", "", true, "127.0.0.1:8090", "drop one of them"},
		{"", "clients.yaml", false, "0.0.0.0:8090", ""},
		{"", "clients.yaml", true, "127.0.0.1:8090", "drop one of them"},
		{"secret", "clients.yaml", false, "0.0.0.0:8090", "both DISCOVERY_TOKEN and --clients-file"},
	} {
		err := checkAuth(tc.token, tc.clients, tc.insecure, tc.listen)
		if tc.want == "" {
			assert.NoError(t, err, "%+v", tc)
		} else {
			assert.ErrorContains(t, err, tc.want, "%+v", tc)
		}
	}
}
