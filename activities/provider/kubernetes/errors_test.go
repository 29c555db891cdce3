package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/proxyfleet/proxyfleet/activities/provider"
)

func TestClassify(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	podKind := schema.GroupKind{Kind: "Pod"}
	tests := []struct {
		name string
		err  error
		kind provider.Kind
	}{
		{
			name: "ResourceQuota exceeded",
			err: apierrors.NewForbidden(pods, "px-a-0",
				errors.New("exceeded quota: compute, requested: pods=1, used: pods=4, limited: pods=4")),
			kind: provider.KindQuota,
		},
		{
			name: "ResourceQuota not counted yet",
			err:  apierrors.NewForbidden(pods, "px-a-0", errors.New("status unknown for quota: compute, resources: pods")),
			kind: provider.KindTransient,
		},
		{
			name: "default ServiceAccount not created yet",
			err: apierrors.NewForbidden(pods, "px-a-0",
				errors.New(`error looking up service account ns/default: serviceaccount "default" not found`)),
			kind: provider.KindTransient,
		},
		{
			name: "RBAC denial",
			err: apierrors.NewForbidden(pods, "",
				errors.New(`User "system:serviceaccount:fleet:worker" cannot create resource "pods" in API group "" in the namespace "egress"`)),
			kind: provider.KindPermanent,
		},
		{
			name: "quota demands limits the spec lacks",
			err:  apierrors.NewForbidden(pods, "px-a-0", errors.New("failed quota: compute: must specify limits.cpu for: squid")),
			kind: provider.KindPermanent,
		},
		{
			name: "Pod Security admission",
			err:  apierrors.NewForbidden(pods, "px-a-0", errors.New(`violates PodSecurity "restricted:latest": runAsNonRoot != true`)),
			kind: provider.KindPermanent,
		},
		{
			name: "invalid pod",
			err: apierrors.NewInvalid(podKind, "px-a-0", field.ErrorList{
				field.Invalid(field.NewPath("spec", "containers").Index(0).Child("image"), "a b", "must not have leading or trailing whitespace"),
			}),
			kind: provider.KindPermanent,
		},
		{name: "bad request", err: apierrors.NewBadRequest("bad"), kind: provider.KindPermanent},
		{name: "conflict", err: apierrors.NewConflict(pods, "px-a-0", errors.New("changed")), kind: provider.KindTransient},
		{name: "server timeout", err: apierrors.NewServerTimeout(pods, "create", 1), kind: provider.KindTransient},
		{name: "throttled", err: apierrors.NewTooManyRequests("slow down", 1), kind: provider.KindTransient},
		{name: "internal error", err: apierrors.NewInternalError(errors.New("etcd")), kind: provider.KindTransient},
		{name: "service unavailable", err: apierrors.NewServiceUnavailable("starting"), kind: provider.KindTransient},
		{name: "missing namespace on create", err: apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "egress"), kind: provider.KindTransient},
		{
			name: "connection refused",
			err:  &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")},
			kind: provider.KindTransient,
		},
		{name: "deadline", err: context.DeadlineExceeded, kind: provider.KindTransient},
		{
			name: "forbidden wrapped by a client",
			err:  fmt.Errorf("post: %w", apierrors.NewForbidden(pods, "px-a-0", errors.New("exceeded quota: q"))),
			kind: provider.KindQuota,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := classify("create pod ns/px-a-0", tc.err)
			require.Error(t, got)
			assert.Equal(t, tc.kind, provider.Class(got))
			assert.ErrorIs(t, got, tc.err, "the API error stays inspectable")
			assert.Contains(t, got.Error(), "create pod ns/px-a-0")
		})
	}
	assert.NoError(t, classify("get", nil))
}
