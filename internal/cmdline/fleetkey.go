package cmdline

import (
	"flag"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// FleetKeyEnv holds the fleet key itself, for deployments that inject secrets as
// environment variables. There is no flag for the key: a flag would show in ps.
const FleetKeyEnv = "PROXYFLEET_FLEET_KEY"

// FleetKeyVar registers --fleet-key-path (env PROXYFLEET_FLEET_KEY_PATH) and returns a
// loader for the keyring the worker and discovery share.
func FleetKeyVar() func() (*proxyauth.Keyring, error) {
	path := flag.String("fleet-key-path", Env("PROXYFLEET_FLEET_KEY_PATH", ""),
		"file holding the fleet key(s) shared by the worker and discovery: base64, one per line, the first signs new instances (env PROXYFLEET_FLEET_KEY_PATH; or give the key itself in env "+FleetKeyEnv+")")
	return func() (*proxyauth.Keyring, error) { return proxyauth.Load(*path, FleetKeyEnv) }
}
