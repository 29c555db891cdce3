package local

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// The control API's wire types, shared by Provider (the client) and the daemon behind
// cmd/localproxyd (internal/localproxy), which serves them.

// Instance states reported by the daemon.
const (
	StateProvisioning = "Provisioning"
	StateRunning      = "Running"
	StateStopped      = "Stopped"
)

// InstanceInfo is the control API's view of an instance.
type InstanceInfo struct {
	Name      string            `json:"name"`
	State     string            `json:"state"`
	IP        string            `json:"ip"`
	Port      int               `json:"port"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"createdAt"`
	Fault     Fault             `json:"fault,omitempty"`
	// Auth reports whether the instance requires credentials. Only an instance restored
	// from an older daemon's state file has none, and it refuses every request. The
	// password's hash is never reported: it stays in the daemon.
	Auth bool `json:"auth"`
}

// CreateRequest is the body of PUT /v1/instances/{name}.
type CreateRequest struct {
	Labels map[string]string `json:"labels,omitempty"`
	// CreatedAt back-dates an instance (tests of the orphan sweeper's minimum age).
	CreatedAt *time.Time `json:"createdAt,omitempty"`
	// Auth is the basic proxy authentication the instance requires; the daemon refuses a
	// create without it, as Managed proxies always require credentials.
	Auth *Auth `json:"auth,omitempty"`
}

// Auth is the basic proxy authentication an instance requires. It carries a hash of the
// password, never the password, so neither the control API's requests nor the daemon's
// state file hold a credential a client could use.
type Auth struct {
	Username string `json:"username"`
	// PasswordSHA256 is the hex SHA-256 of the password. A fast, unsalted hash is enough:
	// Managed passwords are 192 bits of HMAC output (proxyauth.Keyring.Managed), so there
	// is no dictionary to try and a slow hash would only slow every proxied request.
	PasswordSHA256 string `json:"passwordSHA256"`
}

// NewAuth returns the Auth that requires c.
func NewAuth(c proxyauth.Credentials) *Auth {
	sum := sha256.Sum256([]byte(c.Password))
	return &Auth{Username: c.Username, PasswordSHA256: hex.EncodeToString(sum[:])}
}

// Validate reports an Auth no client could ever match, naming the field.
func (a *Auth) Validate() error {
	switch {
	case a == nil:
		return errors.New("auth is required: the username and passwordSHA256 the instance must require")
	case a.Username == "":
		return errors.New("auth.username is empty")
	case strings.ContainsAny(a.Username, ":\r\n"):
		// Basic authentication splits user name and password at the first colon.
		return errors.New("auth.username must not contain a colon or a line break")
	}
	if b, err := hex.DecodeString(a.PasswordSHA256); err != nil || len(b) != sha256.Size {
		return errors.New("auth.passwordSHA256 must be 64 hex digits (the SHA-256 of the password)")
	}
	return nil
}

// Fault makes an instance misbehave on purpose, so health checks can be tested against a
// real proxy that fails in a known way.
type Fault string

const (
	FaultNone Fault = ""
	// FaultAuth answers every request with 407 Proxy Authentication Required.
	FaultAuth Fault = "auth"
	// FaultBadGateway answers every request with 502 Bad Gateway.
	FaultBadGateway Fault = "badgateway"
	// FaultHang accepts connections and never answers.
	FaultHang Fault = "hang"
)
