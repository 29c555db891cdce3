package activities

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyfleet/proxyfleet/activities/monitor"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// probeCredentials resolves auth for the monitor's probes (its Env.Credentials: the Secrets
// and the fleet key are the worker's). A Secret that cannot be read for a passing reason
// (the API server is down) falls back to the sealed copy, so an outage elsewhere does not
// make a working proxy unhealthy.
//
// The sealed text changes only when the credentials do, or, with reseal set, when they
// were sealed under a key that is no longer the primary. A worker whose primary key
// differs from the one that sealed them (during a rotation, or while a rollout runs old
// and new workers side by side) must not re-seal at every Monitor start: each Monitor would
// return at once, on whichever worker, and the proxy would churn history. Re-sealing under
// a new primary waits for the drift interval.
func (a *Activities) probeCredentials(ctx context.Context, auth *ProbeAuth, reseal bool) monitor.Credentials {
	switch {
	case auth == nil:
		return monitor.Credentials{}
	case auth.Secret != "":
		if a.Keyring == nil {
			return monitor.Credentials{Problem: "this worker has no fleet key (--fleet-key-path or PROXYFLEET_FLEET_KEY) to seal the proxy's credentials with", Sealed: auth.Sealed}
		}
		c, err := a.readCredentials(ctx, auth.Namespace, auth.Secret)
		if err != nil {
			var cerr *credentialsError
			// Only a passing failure (the API server slow or away) falls back to what was
			// sealed before; a refusal (RBAC narrowed on purpose) or an unusable Secret
			// does not, or credentials read before the label was required would be sent on.
			refused := apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)
			if !errors.As(err, &cerr) && !refused && auth.Sealed != "" {
				if old, oerr := a.Keyring.Open(auth.Sealed, auth.UID); oerr == nil {
					a.log().WarnContext(ctx, "credentials Secret unreadable; probing with the last ones read", "secret", auth.Namespace+"/"+auth.Secret, "error", err)
					return monitor.Credentials{Creds: old, Sealed: auth.Sealed}
				}
			}
			pc := monitor.Credentials{Problem: err.Error(), Sealed: auth.Sealed}
			if cerr != nil && cerr.reason == v1alpha1.ReasonCredentialsNotLabelled {
				// What was sealed from it before (by a worker that did not ask for the
				// label, or before the label was removed) goes too: discovery must not
				// hand out what the probes may not send.
				pc.Reason, pc.Sealed = cerr.reason, ""
			}
			return pc
		}
		if auth.Sealed != "" {
			if old, err := a.Keyring.Open(auth.Sealed, auth.UID); err == nil && old == c &&
				(!reseal || proxyauth.SealedKeyID(auth.Sealed) == a.Keyring.PrimaryID()) {
				return monitor.Credentials{Creds: c, Sealed: auth.Sealed}
			}
		}
		sealed, err := a.Keyring.Seal(c, auth.UID)
		if err != nil {
			return monitor.Credentials{Problem: err.Error(), Sealed: auth.Sealed}
		}
		return monitor.Credentials{Creds: c, Sealed: sealed}
	case auth.KeyID != "":
		c, err := a.Keyring.Managed(auth.KeyID, auth.Instance)
		if err != nil {
			return monitor.Credentials{Problem: "derive the instance's credentials: " + err.Error()}
		}
		return monitor.Credentials{Creds: c}
	}
	return monitor.Credentials{}
}

// credentialsError is a credentials Secret that cannot serve: missing, not labelled for
// use, or without its keys. Retrying the read will not fix it; the user must.
type credentialsError struct {
	msg string
	// reason is the Healthy condition's reason when ProbeFailed would not say it.
	reason string
}

func (e *credentialsError) Error() string { return e.msg }

// readCredentials reads an External proxy's credentials Secret. Errors name the Secret and
// what is wrong with it, never its data.
//
// The Secret must carry v1alpha1.LabelProxyCredentials: whoever may create a Proxy may
// name any Secret of its namespace, and the credentials go to the endpoint the Proxy
// names. The label is read first, from the Secret's metadata alone, so the data of a
// Secret that may not be used is never fetched; and again on the Secret read, in case it
// was removed in between.
func (a *Activities) readCredentials(ctx context.Context, namespace, name string) (proxyauth.Credentials, error) {
	cctx, cancel := a.callContext(ctx)
	defer cancel()
	key := types.NamespacedName{Namespace: namespace, Name: name}
	notFound := &credentialsError{msg: fmt.Sprintf("credentials Secret %s/%s not found", namespace, name)}
	notLabelled := &credentialsError{
		msg: fmt.Sprintf("credentials Secret %s/%s lacks the label %s=true that allows its credentials to be sent to the proxy; add it to use them",
			namespace, name, v1alpha1.LabelProxyCredentials),
		reason: v1alpha1.ReasonCredentialsNotLabelled,
	}
	var m metav1.PartialObjectMetadata
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	err := a.Kube.Get(cctx, key, &m)
	switch {
	case apierrors.IsNotFound(err):
		return proxyauth.Credentials{}, notFound
	case err != nil:
		return proxyauth.Credentials{}, fmt.Errorf("read credentials Secret %s/%s: %w", namespace, name, err)
	case m.Labels[v1alpha1.LabelProxyCredentials] != "true":
		return proxyauth.Credentials{}, notLabelled
	}
	var s corev1.Secret
	err = a.Kube.Get(cctx, key, &s)
	switch {
	case apierrors.IsNotFound(err):
		return proxyauth.Credentials{}, notFound
	case err != nil:
		return proxyauth.Credentials{}, fmt.Errorf("read credentials Secret %s/%s: %w", namespace, name, err)
	case s.Labels[v1alpha1.LabelProxyCredentials] != "true":
		return proxyauth.Credentials{}, notLabelled
	}
	user, okUser := s.Data[v1alpha1.CredentialsUsernameKey]
	pass, okPass := s.Data[v1alpha1.CredentialsPasswordKey]
	if !okUser || !okPass {
		return proxyauth.Credentials{}, &credentialsError{msg: fmt.Sprintf("credentials Secret %s/%s needs the keys %q and %q",
			namespace, name, v1alpha1.CredentialsUsernameKey, v1alpha1.CredentialsPasswordKey)}
	}
	if strings.ContainsAny(string(user), ":\r\n") || strings.ContainsAny(string(pass), "\r\n") {
		// Basic authentication joins them with a colon: one in the user name would move
		// the split, and a line break would end the header.
		return proxyauth.Credentials{}, &credentialsError{msg: fmt.Sprintf("credentials Secret %s/%s: the username may not contain ':' or line breaks, the password no line breaks", namespace, name)}
	}
	return proxyauth.Credentials{Username: string(user), Password: string(pass)}, nil
}
