package aws

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/activities/provider/squid/squidtest"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestAWSSecretsStayOut: an aws Proxy's cloud-init data reaches its instance (the user
// data runs it at boot) and its proxy password guards it, and neither appears in the
// workflow's history (memos and search attributes included) or in any component's log
// at debug level, the SDK's included.
func TestAWSSecretsStayOut(t *testing.T) {
	logs := &testenv.LogBuffer{}
	c := newCloud(t)
	s := startAWS(t, c, stack.Options{Log: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx := context.Background()
	ns := s.Namespace(t)
	canary := fmt.Sprintf("aws-canary-%d-do-not-leak", time.Now().UnixNano())
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "boot", Labels: map[string]string{v1alpha1.LabelCloudInit: "true"}},
		Data:       map[string][]byte{"user-data": []byte("#!/bin/sh\necho " + canary + " > \"$PROXYFLEET_ROOT/canary\"\n")},
	}
	require.NoError(t, s.Kube.Client.Create(ctx, secret))
	p := awsProxy(s, ns, "booted", squidtest.FreePort(t))
	p.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "boot", Key: "user-data"}}
	require.NoError(t, s.Kube.Client.Create(ctx, p))
	p = s.WaitFor(t, ns, "booted", 2*time.Minute, "Ready", stack.Ready)
	_, err := s.Fetch(p, "/guarded")
	require.NoError(t, err)

	live := c.Live()
	require.Len(t, live, 1)
	script, err := base64.StdEncoding.DecodeString(live[0].UserData)
	require.NoError(t, err)
	ran, err := os.ReadFile(filepath.Join(c.root(live[0].ID), "canary"))
	require.NoError(t, err, "the cloud-init data ran at boot")
	assert.Equal(t, canary+"\n", string(ran))
	creds, err := s.Keyring.Managed(s.Keyring.PrimaryID(), p.Status.InstanceName)
	require.NoError(t, err)
	require.NotContains(t, string(script), creds.Password, "the user data holds the password's hash, not the password")

	needles := map[string][]byte{
		"cloud-init data":           []byte(canary),
		"cloud-init data in base64": []byte(base64.StdEncoding.EncodeToString(secret.Data["user-data"])),
		"user data":                 []byte(live[0].UserData[:64]),
		"proxy password":            []byte(creds.Password),
	}
	it := s.Temporal.Client.GetWorkflowHistory(ctx, contract.ProxyWorkflowID(ns, "booted"), "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	events := 0
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(t, err)
		raw, err := proto.Marshal(ev)
		require.NoError(t, err)
		for what, n := range needles {
			require.False(t, bytes.Contains(raw, n), "%s in the history, event %d (%s)", what, ev.EventId, ev.EventType)
		}
		events++
	}
	require.Positive(t, events)
	out := logs.Bytes()
	require.NotEmpty(t, out, "nothing was logged")
	for what, n := range needles {
		assert.False(t, bytes.Contains(out, n), "%s in the logs", what)
	}
}
