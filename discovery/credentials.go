package discovery

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Why a proxy's credentials could not be resolved: Proxy.CredentialsUnresolved, and the
// reason label of proxyfleet_discovery_credentials_unresolved. The set is closed, so the
// metric has a bounded number of series and no label can carry anything from a memo.
const (
	// CredentialsNoFleetKey: discovery runs without a fleet key.
	CredentialsNoFleetKey = "no_fleet_key"
	// CredentialsUnknownKey: the memo names a fleet key discovery does not hold (rotated
	// out while the proxy still uses it, or the worker runs with another key).
	CredentialsUnknownKey = "unknown_key"
	// CredentialsCannotOpen: sealed credentials do not open with their key: sealed for
	// another Proxy (UID), truncated or altered.
	CredentialsCannotOpen = "cannot_open"
	// CredentialsMalformed: the memo's auth is neither a derivation nor a sealed value.
	CredentialsMalformed = "malformed"
)

// credentialsReasons lists every reason, in the order the metric exports them.
var credentialsReasons = []string{CredentialsNoFleetKey, CredentialsUnknownKey, CredentialsCannotOpen, CredentialsMalformed}

// CredentialsNote is what the refresher needs to warn about a proxy whose credentials did
// not resolve, once per change: what the memo said (Ref; the sealed text is ciphertext, and
// is never logged anyway) and why it failed. Nothing in it is a secret.
type CredentialsNote struct {
	Ref   string
	KeyID string
	Err   error
}

// ResolveCredentials finds the credentials of a proxy whose memo says auth, with kr (which
// may be nil). A nil auth is a proxy that takes none. When they cannot be resolved it
// returns the reason (a Credentials* constant) and an error to log; neither holds a secret.
//
// They are resolved here, when a memo is decoded, rather than per lease: a memo changes
// rarely, leases are the hot path, and deriving once means every lease of the proxy hands
// out the same credentials until its memo changes.
func ResolveCredentials(kr *proxyauth.Keyring, auth *contract.ProxyAuth, uid string) (proxyauth.Credentials, *CredentialsNote, string) {
	if auth == nil {
		return proxyauth.Credentials{}, nil, ""
	}
	derived := auth.KeyID != "" || auth.Instance != ""
	keyID := auth.KeyID
	if !derived {
		keyID = proxyauth.SealedKeyID(auth.Sealed)
	}
	// The note is built only on failure: the memos of a healthy fleet resolve, and a full
	// pass reads every one of them.
	fail := func(reason string, err error) (proxyauth.Credentials, *CredentialsNote, string) {
		return proxyauth.Credentials{}, &CredentialsNote{Ref: auth.KeyID + "\x00" + auth.Instance + "\x00" + auth.Sealed, KeyID: keyID, Err: err}, reason
	}
	switch {
	case derived && auth.Sealed != "":
		return fail(CredentialsMalformed, errors.New("the memo's auth is both derived and sealed"))
	case derived && (auth.KeyID == "" || auth.Instance == ""):
		return fail(CredentialsMalformed, errors.New("the memo's auth needs both a key ID and an instance name"))
	case !derived && auth.Sealed == "":
		return fail(CredentialsMalformed, errors.New("the memo's auth is empty"))
	case keyID == "":
		return fail(CredentialsMalformed, errors.New("the memo's sealed credentials are not a sealed value"))
	case kr == nil:
		return fail(CredentialsNoFleetKey, errors.New("discovery has no fleet key (--fleet-key-path or $PROXYFLEET_FLEET_KEY)"))
	}
	var c proxyauth.Credentials
	var err error
	if derived {
		c, err = kr.Managed(auth.KeyID, auth.Instance)
	} else {
		c, err = kr.Open(auth.Sealed, uid)
	}
	if err == nil {
		return c, nil, ""
	}
	// Told apart here rather than from the keyring's error, whose wording is not an API.
	if ids := kr.IDs(); !slices.Contains(ids, keyID) {
		return fail(CredentialsUnknownKey, fmt.Errorf("fleet key %q is not among discovery's (%s): rotated out while the proxy still uses it, or the worker has another key",
			keyID, strings.Join(ids, ", ")))
	}
	if derived {
		return fail(CredentialsMalformed, err)
	}
	// Its text says "sealed for another proxy, or altered" or "malformed"; never what was
	// sealed.
	return fail(CredentialsCannotOpen, err)
}
