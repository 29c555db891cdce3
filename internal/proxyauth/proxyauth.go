// Package proxyauth holds the credentials crawlers and probes present to proxies, and the
// fleet key they come from.
//
// The fleet key is a secret shared by the worker and discovery, and by nothing else. A
// Managed instance's password is derived from it and the instance's name, so nothing per
// proxy is stored anywhere: the worker derives it to configure the instance and to probe
// it, discovery derives it to hand it to a crawler in a lease answer, and Temporal only
// ever sees the instance name and the key's ID. An External proxy's credentials come from
// a Secret the worker reads; they reach discovery sealed (AES-256-GCM under a key derived
// from the fleet key) inside the workflow's memo, so Temporal's history, memos and Web UI
// hold ciphertext that only the holders of the fleet key can open.
//
// A keyring holds several fleet keys so that one can be rotated in: the first signs new
// instances and seals, the others still open what they sealed and derive what they derived.
package proxyauth

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// ManagedUsername is the user name of every Managed proxy. It is not a secret; the
// password, different for every instance, is.
const ManagedUsername = "proxyfleet"

// MinKeyBytes is the shortest fleet key accepted: 256 bits.
const MinKeyBytes = 32

// redacted replaces a password wherever Credentials are printed, logged or marshalled.
const redacted = "REDACTED"

// Credentials are a user name and password for a proxy's basic authentication. Printing,
// logging or JSON-encoding them shows the user name only: code that must send the password
// (a Proxy-Authorization header, a lease answer) reads the field on purpose.
type Credentials struct {
	Username string
	Password string
}

// Empty reports credentials that authenticate nothing: the proxy takes none.
func (c Credentials) Empty() bool { return c.Username == "" && c.Password == "" }

// String shows the user name only.
func (c Credentials) String() string {
	if c.Empty() {
		return "(no credentials)"
	}
	return c.Username + ":" + redacted
}

// GoString shows the user name only, for %#v.
func (c Credentials) GoString() string { return "proxyauth.Credentials{" + c.String() + "}" }

// LogValue shows the user name only, for slog.
func (c Credentials) LogValue() slog.Value {
	return slog.GroupValue(slog.String("username", c.Username), slog.String("password", redacted))
}

// MarshalJSON shows the user name only: Credentials that end up in a struct bound for a
// log, a workflow payload or an API answer by accident do not carry the password with them.
func (c Credentials) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]string{"username": c.Username, "password": redacted})
}

// Header is the Proxy-Authorization value for basic authentication.
func (c Credentials) Header() string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(c.Username+":"+c.Password))
}

// Match reports, in constant time, whether a Proxy-Authorization header value carries
// these credentials.
func (c Credentials) Match(header string) bool {
	want := c.Header()
	return subtle.ConstantTimeCompare([]byte(header), []byte(want)) == 1
}

// key is one fleet key and what is derived from it once.
type key struct {
	id       string
	password []byte // HMAC key for Managed passwords
	seal     cipher.AEAD
	nonce    []byte // HMAC key for synthetic nonces
	peer     string // bearer token discovery replicas present to each other
}

// Keyring holds the fleet keys. Its zero value holds none; Parse and Load build one.
type Keyring struct {
	keys []key
}

// Derivation labels; changing one changes every credential derived from it.
const (
	infoPassword = "proxyfleet/managed-password/v1"
	infoSeal     = "proxyfleet/seal-key/v1"
	infoNonce    = "proxyfleet/seal-nonce/v1"
	infoID       = "proxyfleet/key-id/v1"
	infoPeer     = "proxyfleet/discovery-peer/v1"
	sealVersion  = "v1"
)

// Parse reads fleet keys from text: one base64 key (standard or URL alphabet, of at least
// 32 bytes) per line or separated by commas; blank lines and lines starting with # are
// skipped. The first key is the primary.
func Parse(text string) (*Keyring, error) {
	var kr Keyring
	seen := map[string]bool{}
	n := 0
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, field := range strings.Split(line, ",") {
			if field = strings.TrimSpace(field); field == "" {
				continue
			}
			n++
			raw, err := decodeKey(field)
			if err != nil {
				return nil, fmt.Errorf("fleet key %d: %w", n, err)
			}
			if len(raw) < MinKeyBytes {
				return nil, fmt.Errorf("fleet key %d: %d bytes, want at least %d (generate one with: head -c 32 /dev/urandom | base64)", n, len(raw), MinKeyBytes)
			}
			k, err := newKey(raw)
			if err != nil {
				return nil, fmt.Errorf("fleet key %d: %w", n, err)
			}
			if seen[k.id] {
				continue
			}
			seen[k.id] = true
			kr.keys = append(kr.keys, k)
		}
	}
	if len(kr.keys) == 0 {
		return nil, errors.New("no fleet key given (generate one with: head -c 32 /dev/urandom | base64)")
	}
	return &kr, nil
}

// Load reads the fleet keys from the file at path, or, when path is empty, from the
// environment variable env. Neither is ever logged.
func Load(path, env string) (*Keyring, error) {
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read the fleet key: %w", err)
		}
		kr, err := Parse(string(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return kr, nil
	}
	if v := os.Getenv(env); v != "" {
		kr, err := Parse(v)
		if err != nil {
			return nil, fmt.Errorf("$%s: %w", env, err)
		}
		return kr, nil
	}
	return nil, fmt.Errorf("no fleet key: set --fleet-key-path or $%s (generate one with: head -c 32 /dev/urandom | base64)", env)
}

func decodeKey(s string) ([]byte, error) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, errors.New("not base64")
}

func newKey(raw []byte) (key, error) {
	derive := func(info string, n int) []byte {
		b, err := hkdf.Key(sha256.New, raw, nil, info, n)
		if err != nil {
			// Only a length over 255 hash sizes fails; these are 32 bytes.
			panic(err)
		}
		return b
	}
	block, err := aes.NewCipher(derive(infoSeal, 32))
	if err != nil {
		return key{}, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return key{}, err
	}
	return key{
		id:       hex.EncodeToString(derive(infoID, 4)),
		password: derive(infoPassword, 32),
		seal:     aead,
		nonce:    derive(infoNonce, 32),
		peer:     hex.EncodeToString(derive(infoPeer, 32)),
	}, nil
}

// PrimaryID is the ID of the key new instances are derived from and new credentials are
// sealed with: 8 lowercase hex characters, fit for a label value.
func (kr *Keyring) PrimaryID() string { return kr.keys[0].id }

// PeerTokens are the bearer tokens discovery replicas present to each other, one per key,
// primary first: a replica sends the first and accepts any, so replicas still agree while
// a rolling update rotates the fleet key. Deriving them from the fleet key, which every
// replica already holds, spares operators a second shared secret.
func (kr *Keyring) PeerTokens() []string {
	if kr == nil {
		return nil
	}
	ts := make([]string, len(kr.keys))
	for i, k := range kr.keys {
		ts[i] = k.peer
	}
	return ts
}

// IDs lists the keys' IDs, primary first.
func (kr *Keyring) IDs() []string {
	ids := make([]string, len(kr.keys))
	for i, k := range kr.keys {
		ids[i] = k.id
	}
	return ids
}

func (kr *Keyring) find(id string) (*key, error) {
	if kr == nil {
		return nil, errors.New("no fleet key is configured")
	}
	for i := range kr.keys {
		if kr.keys[i].id == id {
			return &kr.keys[i], nil
		}
	}
	return nil, fmt.Errorf("fleet key %q is not in the keyring (have %s): it was rotated out while a proxy still uses it", id, strings.Join(kr.IDs(), ", "))
}

// Managed returns the credentials of the Managed instance named instance, derived from
// the fleet key keyID. The same inputs always give the same credentials, and a new
// instance (every replacement has a new name) gets new ones.
func (kr *Keyring) Managed(keyID, instance string) (Credentials, error) {
	if instance == "" {
		return Credentials{}, errors.New("derive credentials: no instance name")
	}
	k, err := kr.find(keyID)
	if err != nil {
		return Credentials{}, err
	}
	mac := hmac.New(sha256.New, k.password)
	mac.Write([]byte(instance))
	// 24 bytes (192 bits) in URL-safe base64 without padding: 32 characters that need
	// no escaping in a URL's userinfo, a header or an htpasswd line.
	return Credentials{Username: ManagedUsername, Password: base64.RawURLEncoding.EncodeToString(mac.Sum(nil)[:24])}, nil
}

type sealed struct {
	U string `json:"u"`
	P string `json:"p"`
}

// Seal encrypts c under the primary key, bound to owner (the Proxy's UID): a sealed value
// copied into another Proxy's memo does not open. Sealing the same credentials for the same
// owner gives the same text, so an unchanged Secret never changes a memo.
func (kr *Keyring) Seal(c Credentials, owner string) (string, error) {
	if kr == nil || len(kr.keys) == 0 {
		return "", errors.New("seal credentials: no fleet key is configured")
	}
	k := &kr.keys[0]
	plain, err := json.Marshal(sealed{U: c.Username, P: c.Password})
	if err != nil {
		return "", err
	}
	// A synthetic nonce (an HMAC of the owner and the plaintext) makes sealing
	// deterministic; GCM stays safe because a nonce repeats only for the same message.
	mac := hmac.New(sha256.New, k.nonce)
	mac.Write([]byte(owner))
	mac.Write([]byte{0})
	mac.Write(plain)
	nonce := mac.Sum(nil)[:k.seal.NonceSize()]
	ct := k.seal.Seal(nil, nonce, plain, []byte(owner))
	return sealVersion + "." + k.id + "." + base64.RawURLEncoding.EncodeToString(append(nonce, ct...)), nil
}

// Open decrypts what Seal gave for the same owner, with whichever key of the ring sealed it.
func (kr *Keyring) Open(text, owner string) (Credentials, error) {
	version, rest, ok1 := strings.Cut(text, ".")
	id, body, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || version != sealVersion {
		return Credentials{}, errors.New("open credentials: not a sealed value")
	}
	k, err := kr.find(id)
	if err != nil {
		return Credentials{}, fmt.Errorf("open credentials: %w", err)
	}
	raw, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil || len(raw) < k.seal.NonceSize() {
		return Credentials{}, errors.New("open credentials: malformed sealed value")
	}
	plain, err := k.seal.Open(nil, raw[:k.seal.NonceSize()], raw[k.seal.NonceSize():], []byte(owner))
	if err != nil {
		return Credentials{}, errors.New("open credentials: sealed for another proxy, or altered")
	}
	var s sealed
	if err := json.Unmarshal(plain, &s); err != nil {
		return Credentials{}, errors.New("open credentials: malformed plaintext")
	}
	return Credentials{Username: s.U, Password: s.P}, nil
}

// SealedKeyID is the ID of the key a sealed value was sealed with, or "".
func SealedKeyID(text string) string {
	parts := strings.SplitN(text, ".", 3)
	if len(parts) != 3 {
		return ""
	}
	return parts[1]
}
