package contract

import "time"

// DeleteSignal asks the workflow to delete the instance of the Proxy with this UID and end.
type DeleteSignal struct {
	UID string `json:"uid"`
}

// ReplaceSignal asks for a make-before-break replacement, e.g. from the temporal CLI:
// --name replace --input '{"reason":"manual"}'.
type ReplaceSignal struct {
	Reason string `json:"reason"`
	// Grant is set by a pool allowing the replacement its member waits for (status
	// condition ReplacementPending): it replaces nothing when none waits, so a grant that
	// arrives late, or twice, costs no instance.
	Grant bool `json:"grant,omitempty"`
}

// ReportSignal is a crawler's verdict on a proxy for one target site, forwarded by
// discovery. banned and rate_limited put the proxy in cooldown for the target until Until.
type ReportSignal struct {
	Target string    `json:"target"`
	Result string    `json:"result"`
	Until  time.Time `json:"until"`
}

// Report results.
const (
	ReportOK          = "ok"
	ReportRateLimited = "rate_limited"
	ReportBanned      = "banned"
)

// MemoKey is the memo field holding ProxyMemo.
const MemoKey = "proxy"

// ProxyMemo is what discovery reads from each running ProxyWorkflow through ListWorkflow,
// without a query per proxy. The workflow upserts it whenever one of its fields changes.
// Its fields are plain strings rather than the Kubernetes API's named types, so readers
// need not link the API; the JSON is the same.
type ProxyMemo struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UID       string `json:"uid"`
	// Phase is the Proxy's status.phase; Healthy is true only in phase Ready, or in phase
	// Replacing while the instance that still serves is healthy (runs of workflow version
	// 5 and later; earlier runs said false there).
	Phase         string            `json:"phase"`
	Healthy       bool              `json:"healthy"`
	IP            string            `json:"ip,omitempty"`
	Port          int32             `json:"port,omitempty"`
	Attributes    map[string]string `json:"attributes,omitempty"`
	LatencyMillis int64             `json:"latencyMillis,omitempty"`
	MaxLeases     int32             `json:"maxLeases,omitempty"`
	// Provider is the Managed provider's name, or "external".
	Provider string `json:"provider,omitempty"`
	// Cooldowns maps a target ("" for every target) to when the proxy may serve it again.
	Cooldowns map[string]time.Time `json:"cooldowns,omitempty"`
	// Auth says where the proxy's credentials come from, never what they are; nil for a
	// proxy that takes none (an External proxy without a credentials Secret).
	Auth *ProxyAuth `json:"auth,omitempty"`
}

// ProxyAuth locates a proxy's credentials for the holders of the fleet key (see
// internal/proxyauth): a Managed instance's are derived from the key KeyID and the
// instance's name; an External proxy's are Sealed for the Proxy's UID.
type ProxyAuth struct {
	KeyID    string `json:"keyID,omitempty"`
	Instance string `json:"instance,omitempty"`
	Sealed   string `json:"sealed,omitempty"`
}
