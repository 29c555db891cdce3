package local

import "time"

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
}

// CreateRequest is the body of PUT /v1/instances/{name}.
type CreateRequest struct {
	Labels map[string]string `json:"labels,omitempty"`
	// CreatedAt back-dates an instance (tests of the orphan sweeper's minimum age).
	CreatedAt *time.Time `json:"createdAt,omitempty"`
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
