package squid

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// InstanceScript is a Managed VM's whole boot configuration, whichever cloud runs it: the
// hardened Squid on port, requiring creds and forwarding only where egress allows,
// followed by the Proxy's own cloud-init data, if any, which therefore adds to Squid's
// configuration and cannot replace what comes before it.
func InstanceScript(port int32, creds proxyauth.Credentials, egress *v1alpha1.Egress, cloudInit []byte) ([]byte, error) {
	if creds.Username == "" || creds.Password == "" {
		// Squid would refuse to start without them, and an instance that fell back to
		// an image's own Squid would be an open proxy.
		return nil, errors.New("the instance has no credentials to require (the worker derives them from its fleet key): refusing to create an open proxy")
	}
	cfg := Config{Port: port, Credentials: creds}
	if egress != nil {
		for _, p := range egress.Ports {
			cfg.Ports = append(cfg.Ports, int32(p))
		}
		for i, c := range egress.AllowedDestinations {
			prefix, err := netip.ParsePrefix(string(c))
			if err != nil {
				return nil, fmt.Errorf("spec.egress.allowedDestinations[%d] %q: not a CIDR", i, c)
			}
			cfg.Allowed = append(cfg.Allowed, prefix)
		}
	}
	files, err := Render(cfg)
	if err != nil {
		return nil, fmt.Errorf("rendering the instance's Squid configuration: %w", err)
	}
	script, err := StartupScript(files, cloudInit)
	if err != nil {
		return nil, fmt.Errorf("rendering the instance's startup script: %w", err)
	}
	return script, nil
}

// UserScriptPath is where StartupScript stores the user's own script before running it.
// It lives with the machine's state, root-only, because a boot configuration may hold
// secrets.
const UserScriptPath = "/var/lib/proxyfleet/user-script"

// heredocEnd ends every embedded file. Base64 text cannot contain '_', so no content can
// end a heredoc early or reach the shell.
const heredocEnd = "PROXYFLEET_EOF"

// StartupScript is a GCP startup-script for a Debian image: the guest agent runs it as
// root at every boot. It installs Squid if it is missing, writes f's squid.conf and passwd
// file (the passwd file mode 0640, group proxy, so only root and Squid read it), restarts
// Squid, and then, if userScript is not empty, stores it at UserScriptPath and runs it: the
// Proxy's own boot configuration, which comes last so it can add to what Squid was given
// (an Include file, say) and restart it again. The script's exit status is the user
// script's, so a failing one is visible in the guest agent's log.
//
// Every step can run again: package installation is skipped when Squid is there, files are
// replaced atomically. PROXYFLEET_ROOT, when set, is a directory every path is taken
// relative to; it exists for tests, and the guest agent never sets it.
func StartupScript(f Files, userScript []byte) ([]byte, error) {
	if len(f.Conf) == 0 || len(f.Passwd) == 0 {
		return nil, errors.New("startup script: files are empty; render them first")
	}
	p := f.Paths.withDefaults()
	for _, pf := range []struct{ name, path string }{{"paths.conf", p.Conf}, {"paths.passwd", p.Passwd}} {
		if err := checkPath(pf.name, pf.path); err != nil {
			return nil, fmt.Errorf("startup script: %w", err)
		}
	}

	var b bytes.Buffer
	b.WriteString(`#!/bin/bash
# Rendered by proxyfleet: this instance's Squid. Run as root at every boot.
set -euo pipefail
root=${PROXYFLEET_ROOT:-}
export DEBIAN_FRONTEND=noninteractive

# The first boot of an image can find the dpkg lock held (unattended upgrades), and its
# package lists missing or stale; a failed install is retried once after an update.
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }
if [ ! -x "$root/usr/sbin/squid" ]; then
	apt_get install -y --no-install-recommends squid || { apt_get update && apt_get install -y --no-install-recommends squid; }
fi

# put PATH MODE GROUP: stores standard input (base64) at PATH, replacing it atomically.
put() {
	mkdir -p "$(dirname "$1")"
	local tmp
	tmp=$(mktemp "$1.XXXXXX")
	base64 -d >"$tmp"
	chmod "$2" "$tmp"
	if [ -n "$3" ]; then chgrp "$3" "$tmp"; fi
	mv -f "$tmp" "$1"
}

`)
	embed(&b, p.Conf, "0644", "", f.Conf)
	embed(&b, p.Passwd, "0640", "proxy", f.Passwd)
	b.WriteString(`
systemctl enable squid
systemctl restart squid
`)
	if len(userScript) > 0 {
		b.WriteString("\n# The Proxy's own boot configuration.\n")
		embed(&b, UserScriptPath, "0700", "", userScript)
		fmt.Fprintf(&b, "%s\n", shellQuoteRooted(UserScriptPath))
	}
	return b.Bytes(), nil
}

// embed writes the shell lines that store content at path.
func embed(b *bytes.Buffer, path, mode, group string, content []byte) {
	fmt.Fprintf(b, "put %s %s %s <<'%s'\n", shellQuoteRooted(path), mode, shellQuote(group), heredocEnd)
	enc := base64.StdEncoding.EncodeToString(content)
	for len(enc) > 76 {
		b.WriteString(enc[:76] + "\n")
		enc = enc[76:]
	}
	b.WriteString(enc + "\n" + heredocEnd + "\n")
}

// shellQuoteRooted is path under $root, quoted for the shell.
func shellQuoteRooted(path string) string { return `"$root"` + shellQuote(path) }

// shellQuote quotes s as one shell word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
