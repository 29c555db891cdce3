package proxyauth

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func testKey(b byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32))
}

func TestParseRefusesWhatIsNotAKey(t *testing.T) {
	for name, text := range map[string]string{
		"empty":      "",
		"comments":   "# nothing\n\n",
		"short":      base64.StdEncoding.EncodeToString([]byte("too short")),
		"not base64": "!!!!",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(text)
			require.Error(t, err)
		})
	}
}

func TestManagedCredentialsAreDerivedPerInstance(t *testing.T) {
	kr, err := Parse(testKey(1))
	require.NoError(t, err)
	a, err := kr.Managed(kr.PrimaryID(), "px-abc-1")
	require.NoError(t, err)
	again, err := kr.Managed(kr.PrimaryID(), "px-abc-1")
	require.NoError(t, err)
	b, err := kr.Managed(kr.PrimaryID(), "px-abc-2")
	require.NoError(t, err)
	assert.Equal(t, a, again, "the worker and discovery must derive the same credentials")
	assert.NotEqual(t, a.Password, b.Password, "a replacement gets new credentials")
	assert.Equal(t, ManagedUsername, a.Username)
	assert.Len(t, a.Password, 32)

	other, err := Parse(testKey(2))
	require.NoError(t, err)
	assert.NotEqual(t, kr.PrimaryID(), other.PrimaryID())
	_, err = other.Managed(kr.PrimaryID(), "px-abc-1")
	assert.ErrorContains(t, err, "not in the keyring")
}

func TestRotationKeepsOldKeysUsable(t *testing.T) {
	old, err := Parse(testKey(1))
	require.NoError(t, err)
	sealedOld, err := old.Seal(Credentials{Username: "u", Password: "p"}, "uid-1")
	require.NoError(t, err)
	derivedOld, err := old.Managed(old.PrimaryID(), "px-1")
	require.NoError(t, err)

	both, err := Parse("# new key first, then the old one\n" + testKey(2) + "\n" + testKey(1) + "\n")
	require.NoError(t, err)
	assert.NotEqual(t, old.PrimaryID(), both.PrimaryID())
	assert.Equal(t, []string{both.PrimaryID(), old.PrimaryID()}, both.IDs())
	got, err := both.Open(sealedOld, "uid-1")
	require.NoError(t, err)
	assert.Equal(t, Credentials{Username: "u", Password: "p"}, got)
	derived, err := both.Managed(old.PrimaryID(), "px-1")
	require.NoError(t, err)
	assert.Equal(t, derivedOld, derived)

	sealedNew, err := both.Seal(Credentials{Username: "u", Password: "p"}, "uid-1")
	require.NoError(t, err)
	assert.Equal(t, both.PrimaryID(), SealedKeyID(sealedNew))
}

func TestSealIsDeterministicAndBoundToItsOwner(t *testing.T) {
	kr, err := Parse(testKey(1))
	require.NoError(t, err)
	c := Credentials{Username: "crawler", Password: "s3cr3t-canary"}
	s1, err := kr.Seal(c, "uid-1")
	require.NoError(t, err)
	s2, err := kr.Seal(c, "uid-1")
	require.NoError(t, err)
	assert.Equal(t, s1, s2, "an unchanged Secret must not change the memo")
	assert.NotContains(t, s1, "s3cr3t-canary")
	s3, err := kr.Seal(Credentials{Username: "crawler", Password: "other"}, "uid-1")
	require.NoError(t, err)
	assert.NotEqual(t, s1, s3)

	got, err := kr.Open(s1, "uid-1")
	require.NoError(t, err)
	assert.Equal(t, c, got)
	_, err = kr.Open(s1, "uid-2")
	assert.ErrorContains(t, err, "another proxy")
	tampered := s1[:len(s1)-2] + "AA"
	if tampered == s1 {
		tampered = s1[:len(s1)-2] + "BB"
	}
	_, err = kr.Open(tampered, "uid-1")
	assert.Error(t, err)
	_, err = kr.Open("plain:text", "uid-1")
	assert.Error(t, err)
}

func TestCredentialsNeverPrintTheirPassword(t *testing.T) {
	c := Credentials{Username: "crawler", Password: "s3cr3t-canary"}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "creds", c, "nested", struct{ C Credentials }{c})
	slog.New(slog.NewTextHandler(&logs, nil)).Info("x", "creds", c)
	js, err := json.Marshal(struct{ C Credentials }{c})
	require.NoError(t, err)
	for _, out := range []string{
		fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s", c, c, c, c), logs.String(), string(js),
	} {
		assert.NotContains(t, out, "s3cr3t-canary")
		assert.Contains(t, out, "crawler")
	}
	assert.True(t, c.Match(c.Header()))
	assert.False(t, c.Match(Credentials{Username: "crawler", Password: "wrong"}.Header()))
	assert.False(t, c.Match(""))
	assert.True(t, strings.HasPrefix(c.Header(), "Basic "))
}

func TestParseTakesCommasAndLines(t *testing.T) {
	lines, err := Parse(testKey(1) + "\n" + testKey(2))
	require.NoError(t, err)
	commas, err := Parse(testKey(1) + ", " + testKey(2))
	require.NoError(t, err)
	assert.Equal(t, lines.IDs(), commas.IDs())
	_, err = Parse(testKey(1) + "\n!!!!")
	assert.ErrorContains(t, err, "fleet key 2")
}
