package workflows

import (
	"encoding/base64"
	"strings"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// testKeys is the fleet key of the workflow tests' activities: a fixed one, so recorded
// histories and runs derive the same credentials.
var testKeys = func() *proxyauth.Keyring {
	kr, err := proxyauth.Parse(base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", proxyauth.MinKeyBytes))))
	if err != nil {
		panic(err)
	}
	return kr
}()
