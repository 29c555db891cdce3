package cmdline

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{Temporal: true}))
}

// testCA issues certificates for the test's TLS listener and clients.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM certificate and key for name, server or client.
func (ca *testCA) issue(t *testing.T, serial int64, name string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{name}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// tlsFront terminates TLS on 127.0.0.1 and passes the bytes to the dev server, as a
// TLS-terminating load balancer in front of a Temporal cluster would. It records the serial
// of every client certificate it saw.
type tlsFront struct {
	addr    string
	mu      sync.Mutex
	serials []int64
}

func startFront(t *testing.T, ca *testCA, requireClientCert bool) *tlsFront {
	t.Helper()
	certPEM, keyPEM := ca.issue(t, 100, "temporal.test", true)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
	if requireClientCert {
		cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, pool
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	f := &tlsFront{addr: ln.Addr().String()}
	backend := testenv.Temporal(t).HostPort
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				tc := conn.(*tls.Conn)
				if tc.Handshake() != nil {
					return
				}
				if peers := tc.ConnectionState().PeerCertificates; len(peers) > 0 {
					f.mu.Lock()
					f.serials = append(f.serials, peers[0].SerialNumber.Int64())
					f.mu.Unlock()
				}
				up, err := net.Dial("tcp", backend)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, conn); _ = up.Close() }()
				_, _ = io.Copy(conn, up)
			}()
		}
	}()
	return f
}

func (f *tlsFront) sawSerial(n int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.serials {
		if s == n {
			return true
		}
	}
	return false
}

func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, b, 0o600))
	return p
}

// reach dials with t's flags and asks the server something; it returns the error.
func reach(tf *Temporal, log *slog.Logger) error {
	opts, err := tf.ClientOptions(log)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.DialContext(ctx, opts)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.CheckHealth(ctx, &client.CheckHealthRequest{})
	return err
}

// TestTemporalOverTLS: the binaries reach a Temporal server that requires TLS, checked
// against a given CA under a given server name; mTLS with a client certificate that is read
// again when its files change; and an API key from a file. Without the right settings they
// do not get through.
func TestTemporalOverTLS(t *testing.T) {
	env := testenv.Temporal(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ca := newCA(t)
	dir := t.TempDir()
	caPath := writeFile(t, dir, "ca.pem", ca.pem)

	t.Run("server-auth TLS", func(t *testing.T) {
		front := startFront(t, ca, false)
		ok := &Temporal{Address: front.addr, Namespace: env.Namespace,
			Security: TemporalSecurity{CAPath: caPath, ServerName: "temporal.test"}}
		require.NoError(t, reach(ok, log))
		plain := &Temporal{Address: front.addr, Namespace: env.Namespace}
		assert.Error(t, reach(plain, log), "plaintext to a TLS server")
		wrongName := &Temporal{Address: front.addr, Namespace: env.Namespace,
			Security: TemporalSecurity{CAPath: caPath, ServerName: "other.test"}}
		assert.Error(t, reach(wrongName, log), "a certificate for another name")
		systemRoots := &Temporal{Address: front.addr, Namespace: env.Namespace,
			Security: TemporalSecurity{TLS: true, ServerName: "temporal.test"}}
		assert.Error(t, reach(systemRoots, log), "a CA the system does not trust")
	})

	t.Run("mTLS with rotation", func(t *testing.T) {
		front := startFront(t, ca, true)
		noCert := &Temporal{Address: front.addr, Namespace: env.Namespace,
			Security: TemporalSecurity{CAPath: caPath, ServerName: "temporal.test"}}
		assert.Error(t, reach(noCert, log), "no client certificate")

		cert, key := ca.issue(t, 201, "worker", false)
		certPath, keyPath := writeFile(t, dir, "client.pem", cert), writeFile(t, dir, "client-key.pem", key)
		tf := &Temporal{Address: front.addr, Namespace: env.Namespace,
			Security: TemporalSecurity{CAPath: caPath, ServerName: "temporal.test", CertPath: certPath, KeyPath: keyPath}}
		opts, err := tf.ClientOptions(log)
		require.NoError(t, err)
		require.NoError(t, reach(tf, log))
		assert.True(t, front.sawSerial(201))

		// Rotate the files in place; the same options present the new certificate on the
		// next connection.
		cert, key = ca.issue(t, 202, "worker", false)
		writeFile(t, dir, "client.pem", cert)
		writeFile(t, dir, "client-key.pem", key)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := client.DialContext(ctx, opts)
		require.NoError(t, err)
		_, err = c.CheckHealth(ctx, &client.CheckHealthRequest{})
		c.Close()
		require.NoError(t, err)
		assert.True(t, front.sawSerial(202), "the rotated certificate was used")
	})

	t.Run("API key", func(t *testing.T) {
		front := startFront(t, ca, false)
		const secret = "tmprl-api-key-canary-7f3a"
		keyPath := writeFile(t, dir, "api-key", []byte(secret+"\n"))
		tf := &Temporal{Address: front.addr, Namespace: env.Namespace,
			Security: TemporalSecurity{CAPath: caPath, ServerName: "temporal.test", APIKeyPath: keyPath}}
		opts, err := tf.ClientOptions(log)
		require.NoError(t, err)
		require.NotNil(t, opts.Credentials)
		require.NotNil(t, opts.ConnectionOptions.TLS, "an API key is sent over TLS only")
		require.NoError(t, reach(tf, log))
		assert.NotContains(t, logs.String(), secret, "the key never reaches a log")
	})

	t.Run("bad settings are refused with a reason", func(t *testing.T) {
		for _, s := range []TemporalSecurity{
			{CertPath: "x"},
			{APIKey: "a", APIKeyPath: "b"},
			{CAPath: filepath.Join(dir, "missing.pem")},
			{CAPath: writeFile(t, dir, "not-pem", []byte("hello"))},
		} {
			_, err := (&Temporal{Address: "127.0.0.1:1", Security: s}).ClientOptions(log)
			assert.Error(t, err, "%+v", s)
		}
	})
}
