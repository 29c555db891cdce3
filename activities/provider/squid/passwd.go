package squid

import (
	"crypto/md5"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// maxCredentialBytes bounds a user name or password. Derived passwords are 32 characters;
// the bound keeps a Secret's typo (a whole file pasted as a password) from reaching Squid,
// whose helper reads a line of at most 8 KiB.
const maxCredentialBytes = 256

// md5CryptMagic marks an MD5-crypt hash. basic_ncsa_auth verifies it with its own MD5-crypt
// code, not only through crypt(3), so it works whatever hashes the system's libcrypt was
// built with (Debian's Squid 5.7 and Ubuntu's 6.6 alike); bcrypt or SHA-crypt would depend
// on libcrypt.
const md5CryptMagic = "$1$"

// cryptAlphabet is the crypt(3) base-64 alphabet.
const cryptAlphabet = "./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// checkCredentials refuses what the passwd file or Squid's Basic authentication would
// misread: the file is "user:hash" lines, skipped when they start with '#' or a blank; the
// Basic header splits user from password at the first ':'. Passwords may contain ':' and
// spaces (Squid escapes them for the helper); control characters are refused everywhere.
func checkCredentials(c proxyauth.Credentials) error {
	if c.Username == "" || c.Password == "" {
		return errors.New("credentials: a user name and a password are required (a proxy without them would be open)")
	}
	if len(c.Username) > maxCredentialBytes || len(c.Password) > maxCredentialBytes {
		return fmt.Errorf("credentials: user name and password are limited to %d bytes", maxCredentialBytes)
	}
	for _, r := range c.Username {
		if r <= ' ' || r > '~' || r == ':' {
			return fmt.Errorf("credentials: user name %q: only printable ASCII without spaces and ':' is allowed", c.Username)
		}
	}
	if strings.HasPrefix(c.Username, "#") {
		return fmt.Errorf("credentials: user name %q: a leading '#' makes a comment of the passwd line", c.Username)
	}
	for _, r := range c.Password {
		if r < ' ' || r > '~' {
			// The password itself is never printed.
			return errors.New("credentials: the password may contain only printable ASCII characters")
		}
	}
	return nil
}

// passwdLine is the htpasswd line for c, with a salt derived from c so that the same
// credentials always give the same line (a re-rendering is byte-identical).
//
// The salt is public (it is part of the hash), so it must not be a fast function of the
// password: a salt of sha256(password) would let anyone who reads the file test guesses
// at SHA-256 speed instead of MD5-crypt's. It is therefore derived from an MD5-crypt of
// the password, which costs a guess as much as the final hash does.
func passwdLine(c proxyauth.Credentials) string {
	userSalt := sha256.Sum256([]byte("proxyfleet/squid-passwd-salt/v1\x00" + c.Username))
	inner := md5Crypt(c.Password, cryptBase64(userSalt[:6]))
	sum := sha256.Sum256([]byte("proxyfleet/squid-passwd-salt/v1\x00" + c.Username + "\x00" + inner))
	return c.Username + ":" + md5Crypt(c.Password, cryptBase64(sum[:6])) + "\n"
}

// cryptBase64 encodes b with the crypt alphabet, six bits at a time, high bits first
// (6 bytes give the 8 characters of an MD5-crypt salt).
func cryptBase64(b []byte) string {
	var sb strings.Builder
	var acc, bits uint
	for _, c := range b {
		acc = acc<<8 | uint(c)
		bits += 8
		for bits >= 6 {
			bits -= 6
			sb.WriteByte(cryptAlphabet[(acc>>bits)&0x3f])
		}
	}
	if bits > 0 {
		sb.WriteByte(cryptAlphabet[(acc<<(6-bits))&0x3f])
	}
	return sb.String()
}

// md5Crypt is the MD5-based crypt(3) ("$1$", as `openssl passwd -1` computes it) of
// password with salt (its first 8 characters count, as in every implementation).
func md5Crypt(password, salt string) string {
	if len(salt) > 8 {
		salt = salt[:8]
	}
	pw := []byte(password)

	alt := md5.Sum([]byte(password + salt + password))

	h := md5.New()
	h.Write(pw)
	h.Write([]byte(md5CryptMagic))
	h.Write([]byte(salt))
	for n := len(pw); n > 0; n -= 16 {
		h.Write(alt[:min(n, 16)])
	}
	// The original algorithm meant to mix in alt here but reads a zeroed buffer; every
	// implementation keeps that quirk, so it is part of the format.
	for n := len(pw); n > 0; n >>= 1 {
		if n&1 != 0 {
			h.Write([]byte{0})
		} else {
			h.Write(pw[:1])
		}
	}
	final := h.Sum(nil)

	// The rounds exist to make guessing slower.
	for i := range 1000 {
		r := md5.New()
		if i&1 != 0 {
			r.Write(pw)
		} else {
			r.Write(final)
		}
		if i%3 != 0 {
			r.Write([]byte(salt))
		}
		if i%7 != 0 {
			r.Write(pw)
		}
		if i&1 != 0 {
			r.Write(final)
		} else {
			r.Write(pw)
		}
		final = r.Sum(final[:0])
	}

	var sb strings.Builder
	sb.WriteString(md5CryptMagic + salt + "$")
	put := func(v uint32, n int) {
		for ; n > 0; n-- {
			sb.WriteByte(cryptAlphabet[v&0x3f])
			v >>= 6
		}
	}
	// The format's own byte order: three bytes to four characters, low bits first.
	for _, g := range [5][3]int{{0, 6, 12}, {1, 7, 13}, {2, 8, 14}, {3, 9, 15}, {4, 10, 5}} {
		put(uint32(final[g[0]])<<16|uint32(final[g[1]])<<8|uint32(final[g[2]]), 4)
	}
	put(uint32(final[11]), 2)
	return sb.String()
}
