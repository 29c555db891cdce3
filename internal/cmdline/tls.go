package cmdline

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"

	"go.temporal.io/sdk/client"
)

// TemporalSecurity is how a binary proves itself to, and checks, a Temporal server that
// requires it: TLS with the system's or a given CA, a client certificate (mTLS), an API key.
// The environment variables are the temporal CLI's, so one environment serves both.
type TemporalSecurity struct {
	TLS                bool
	CAPath             string
	CertPath, KeyPath  string
	ServerName         string
	APIKey, APIKeyPath string
}

// securityFlags registers the TLS and API key flags on t.
func (t *Temporal) securityFlags() {
	s := &t.Security
	flag.BoolVar(&s.TLS, "temporal-tls", Env("TEMPORAL_TLS", "") == "true",
		"connect to Temporal over TLS, checked against the system's CAs (implied by the other TLS flags and by an API key) (env TEMPORAL_TLS)")
	flag.StringVar(&s.CAPath, "temporal-tls-ca-path", Env("TEMPORAL_TLS_CA_PATH", ""),
		"PEM file of the CA that signed the Temporal server's certificate (env TEMPORAL_TLS_CA_PATH)")
	flag.StringVar(&s.CertPath, "temporal-tls-cert-path", Env("TEMPORAL_TLS_CERT_PATH", ""),
		"PEM client certificate for mTLS; read again when the file changes (env TEMPORAL_TLS_CERT_PATH)")
	flag.StringVar(&s.KeyPath, "temporal-tls-key-path", Env("TEMPORAL_TLS_KEY_PATH", ""),
		"PEM private key of the client certificate (env TEMPORAL_TLS_KEY_PATH)")
	flag.StringVar(&s.ServerName, "temporal-tls-server-name", Env("TEMPORAL_TLS_SERVER_NAME", ""),
		"name to check the server's certificate against, when it differs from the address's host (env TEMPORAL_TLS_SERVER_NAME)")
	flag.StringVar(&s.APIKeyPath, "temporal-api-key-path", Env("TEMPORAL_API_KEY_PATH", ""),
		"file holding a Temporal API key (e.g. Temporal Cloud), read again when it changes (env TEMPORAL_API_KEY_PATH; or set TEMPORAL_API_KEY)")
	// The key itself is taken from the environment only: a flag would show in ps.
	s.APIKey = os.Getenv("TEMPORAL_API_KEY")
}

// apply sets the connection security on opts.
func (s TemporalSecurity) apply(opts *client.Options) error {
	if s.CertPath != "" || s.KeyPath != "" {
		if s.CertPath == "" || s.KeyPath == "" {
			return errors.New("--temporal-tls-cert-path and --temporal-tls-key-path go together")
		}
	}
	if s.APIKey != "" && s.APIKeyPath != "" {
		return errors.New("set TEMPORAL_API_KEY or --temporal-api-key-path, not both")
	}
	useTLS := s.TLS || s.CAPath != "" || s.CertPath != "" || s.ServerName != "" || s.APIKey != "" || s.APIKeyPath != ""
	if !useTLS {
		return nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: s.ServerName}
	if s.CAPath != "" {
		pem, err := os.ReadFile(s.CAPath)
		if err != nil {
			return fmt.Errorf("read the Temporal CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("%s holds no PEM certificate", s.CAPath)
		}
		cfg.RootCAs = pool
	}
	if s.CertPath != "" {
		certs := &reloading[tls.Certificate]{paths: []string{s.CertPath, s.KeyPath}, load: func() (tls.Certificate, error) {
			return tls.LoadX509KeyPair(s.CertPath, s.KeyPath)
		}}
		if _, err := certs.get(); err != nil {
			return fmt.Errorf("load the Temporal client certificate: %w", err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := certs.get()
			return &c, err
		}
	}
	opts.ConnectionOptions.TLS = cfg
	switch {
	case s.APIKey != "":
		opts.Credentials = client.NewAPIKeyStaticCredentials(s.APIKey)
	case s.APIKeyPath != "":
		keys := &reloading[string]{paths: []string{s.APIKeyPath}, load: func() (string, error) {
			b, err := os.ReadFile(s.APIKeyPath)
			key := strings.TrimSpace(string(b))
			if err == nil && key == "" {
				err = fmt.Errorf("%s is empty", s.APIKeyPath)
			}
			return key, err
		}}
		if _, err := keys.get(); err != nil {
			return fmt.Errorf("read the Temporal API key: %w", err)
		}
		opts.Credentials = client.NewAPIKeyDynamicCredentials(func(context.Context) (string, error) { return keys.get() })
	}
	return nil
}

// reloading holds a value loaded from files and loads it again when any of them changes
// (by modification time or size), so a rotated certificate or key is used from the next
// connection or call on, without a restart. A failed reload keeps the last good value.
type reloading[T any] struct {
	paths []string
	load  func() (T, error)

	mu    sync.Mutex
	stamp string
	value T
	ok    bool
}

func (r *reloading[T]) get() (T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var stamp strings.Builder
	for _, p := range r.paths {
		if fi, err := os.Stat(p); err == nil {
			fmt.Fprintf(&stamp, "%s:%d:%d;", p, fi.ModTime().UnixNano(), fi.Size())
		}
	}
	if r.ok && stamp.String() == r.stamp {
		return r.value, nil
	}
	v, err := r.load()
	if err != nil {
		if r.ok {
			return r.value, nil
		}
		return v, err
	}
	r.value, r.stamp, r.ok = v, stamp.String(), true
	return v, nil
}
