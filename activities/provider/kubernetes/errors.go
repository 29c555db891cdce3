package kubernetes

import (
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/proxyfleet/proxyfleet/activities/provider"
)

// classify wraps an API error from op with the kind the workflow acts on. It is the one
// place Kubernetes errors are mapped, so the rules below are the whole taxonomy.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	wrapped := fmt.Errorf("%s: %w", op, err)
	switch {
	case apierrors.IsForbidden(err):
		// The admission plugins say why only in the message; there is no finer reason.
		msg := err.Error()
		switch {
		case strings.Contains(msg, "exceeded quota"):
			// ResourceQuota admission: the namespace is full. Freeing quota or raising it
			// fixes this without touching the Proxy, so it is a wait, not a failure.
			return provider.QuotaError(wrapped)
		case strings.Contains(msg, "status unknown for quota"):
			// A ResourceQuota the quota controller has not counted yet (just created, or the
			// controller is behind): admission refuses until it has, then decides.
			return wrapped
		case strings.Contains(msg, "error looking up service account"):
			// A namespace created moments ago has no "default" ServiceAccount until the
			// controller manager adds it; every pod is refused until then.
			return wrapped
		default:
			// RBAC denials, Pod Security admission, a terminating namespace: an operator
			// has to act before a retry can succeed.
			return provider.Permanent(wrapped)
		}
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		// The pod as built from the spec is refused (bad image reference, requests above
		// limits, ...); the same spec will be refused again.
		return provider.Permanent(wrapped)
	default:
		// Timeouts, 5xx, conflicts, throttling, connection errors: retried with backoff.
		// A NotFound here is a missing namespace on Create, which creating it fixes.
		return wrapped
	}
}
