package activities_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// testKeys is a fleet key for the activities' tests.
func testKeys(t testing.TB) *proxyauth.Keyring {
	t.Helper()
	kr, err := proxyauth.Parse(base64.StdEncoding.EncodeToString([]byte(strings.Repeat("a", proxyauth.MinKeyBytes))))
	require.NoError(t, err)
	return kr
}
