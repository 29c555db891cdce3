package ec2test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// STS is an AWS STS stand-in on 127.0.0.1 answering AssumeRoleWithWebIdentity, the call
// the SDK's default chain makes for IRSA on EKS (a projected token file and a role ARN in
// the environment): for Role and Token it gives AccessKeyID's credentials, for an hour;
// anything else is refused as STS refuses it.
type STS struct {
	*httptest.Server
	Role, Token string
	// AccessKeyID is the key the credentials it hands out sign with.
	AccessKeyID string

	mu    sync.Mutex
	calls int
}

// NewSTS starts the stand-in, closed when the test ends.
func NewSTS(t testing.TB, role, token string) *STS {
	s := &STS{Role: role, Token: token, AccessKeyID: "ASIAWEBIDENTITY00001"}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// Exchanges is how many tokens were exchanged for credentials.
func (s *STS) Exchanges() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func (s *STS) serve(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	f := r.PostForm
	w.Header().Set("Content-Type", "text/xml")
	if f.Get("Action") != "AssumeRoleWithWebIdentity" || f.Get("RoleArn") != s.Role || f.Get("WebIdentityToken") != s.Token {
		w.WriteHeader(http.StatusForbidden)
		_, _ = fmt.Fprint(w, `<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type>`+
			`<Code>AccessDenied</Code><Message>Not authorized to perform sts:AssumeRoleWithWebIdentity</Message></Error>`+
			`<RequestId>req-sts</RequestId></ErrorResponse>`)
		return
	}
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	_, _ = fmt.Fprintf(w, `<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>%s</AccessKeyId>
<SecretAccessKey>role-secret</SecretAccessKey><SessionToken>role-session</SessionToken>
<Expiration>%s</Expiration></Credentials></AssumeRoleWithWebIdentityResult>
<ResponseMetadata><RequestId>req-sts</RequestId></ResponseMetadata></AssumeRoleWithWebIdentityResponse>`,
		s.AccessKeyID, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
}
