package squid

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// TestMD5CryptVectors: fixed vectors, computed with `openssl passwd -1 -salt SALT PASSWORD`
// (OpenSSL 3.0), cover an empty password, a password longer than an MD5 block and a salt
// longer than the 8 characters that count.
func TestMD5CryptVectors(t *testing.T) {
	for _, tc := range []struct{ password, salt, want string }{
		{"password", "saltstri", "$1$saltstri$qQY4WxjABChYG1ccLpfkz/"},
		{"", "ab", "$1$ab$rn6aQS/o7141mj179E/zA."},
		{"a much longer password than sixteen bytes, to wrap", "12345678", "$1$12345678$JA/e69G6SropGOynCWk/4."},
		{"a much longer password than sixteen bytes, to wrap", "12345678IGNORED", "$1$12345678$JA/e69G6SropGOynCWk/4."},
		{"Secr:et pass", "x.y/Z9", "$1$x.y/Z9$uDU3oEtx3NsUB/yXkm/Zs1"},
	} {
		assert.Equal(t, tc.want, md5Crypt(tc.password, tc.salt), "password %q salt %q", tc.password, tc.salt)
	}
}

// TestMD5CryptMatchesOpenSSL compares with openssl on the machine, for passwords of the
// lengths where the algorithm's loops change (MD5 blocks of 16, the bits of the length),
// when openssl is there.
func TestMD5CryptMatchesOpenSSL(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("openssl is not installed; TestMD5CryptVectors holds vectors it computed")
	}
	for _, n := range []int{0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 39} {
		password := strings.Repeat("pA5s:w0rd ", 4)[:n]
		salt := cryptBase64([]byte{byte(n), 1, 2, 3, 4, 5})
		out, err := exec.Command(openssl, "passwd", "-1", "-salt", salt, password).Output()
		require.NoError(t, err)
		assert.Equal(t, strings.TrimSpace(string(out)), md5Crypt(password, salt), "password of %d bytes", n)
	}
}

func TestCryptBase64(t *testing.T) {
	assert.Equal(t, "........", cryptBase64(make([]byte, 6)))
	assert.Equal(t, "zzzzzzzz", cryptBase64([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}))
	assert.Equal(t, "/.", cryptBase64([]byte{0x04}), "a partial group is padded with zero bits")
}

func TestPasswdLine(t *testing.T) {
	c := proxyauth.Credentials{Username: "proxyfleet", Password: "hunter2hunter2"}
	line := passwdLine(c)
	assert.Equal(t, line, passwdLine(c), "the same credentials give the same line")
	user, hash, ok := strings.Cut(strings.TrimSuffix(line, "\n"), ":")
	require.True(t, ok)
	assert.Equal(t, "proxyfleet", user)
	require.True(t, strings.HasPrefix(hash, "$1$"), hash)
	salt, _, _ := strings.Cut(strings.TrimPrefix(hash, "$1$"), "$")
	assert.Len(t, salt, 8)
	assert.Equal(t, hash, md5Crypt(c.Password, salt), "the line verifies the password")
	assert.NotContains(t, line, c.Password)

	other := passwdLine(proxyauth.Credentials{Username: "proxyfleet", Password: "hunter3hunter3"})
	otherSalt, _, _ := strings.Cut(strings.TrimPrefix(strings.SplitN(other, ":", 2)[1], "$1$"), "$")
	assert.NotEqual(t, salt, otherSalt, "another password gets another salt")
}

func TestCheckCredentials(t *testing.T) {
	ok := []proxyauth.Credentials{
		{Username: "proxyfleet", Password: "AbC-123_xyz"},
		{Username: "Mixed.Case@example", Password: "with: colons and spaces ~!"},
		{Username: "u", Password: "p"},
	}
	for _, c := range ok {
		assert.NoError(t, checkCredentials(c), "%q", c.Username)
	}
	bad := []struct {
		name string
		c    proxyauth.Credentials
	}{
		{"empty", proxyauth.Credentials{}},
		{"no password", proxyauth.Credentials{Username: "u"}},
		{"no user", proxyauth.Credentials{Password: "S3cr3t-pw"}},
		{"colon in user", proxyauth.Credentials{Username: "a:b", Password: "S3cr3t-pw"}},
		{"space in user", proxyauth.Credentials{Username: "a b", Password: "S3cr3t-pw"}},
		{"newline in user", proxyauth.Credentials{Username: "a\nb", Password: "S3cr3t-pw"}},
		{"comment user", proxyauth.Credentials{Username: "#root", Password: "S3cr3t-pw"}},
		{"non-ASCII user", proxyauth.Credentials{Username: "jürgen", Password: "S3cr3t-pw"}},
		{"newline in password", proxyauth.Credentials{Username: "u", Password: "p\nroot:$1$x$y"}},
		{"CR in password", proxyauth.Credentials{Username: "u", Password: "p\r"}},
		{"NUL in password", proxyauth.Credentials{Username: "u", Password: "p\x00q"}},
		{"tab in password", proxyauth.Credentials{Username: "u", Password: "p\tq"}},
		{"long password", proxyauth.Credentials{Username: "u", Password: strings.Repeat("p", maxCredentialBytes+1)}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			err := checkCredentials(tc.c)
			require.Error(t, err)
			if tc.c.Password != "" {
				assert.NotContains(t, err.Error(), tc.c.Password, "errors never show the password")
			}
		})
	}
}
