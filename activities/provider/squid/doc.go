// Package squid renders the hardened Squid configuration that Managed instances run (a GCP
// VM's Squid through its startup script, a Kubernetes pod's through its mounted files), so
// every instance enforces the same rules whatever its provider:
//
//   - basic authentication first: a client without valid credentials gets 407 before any
//     other rule is evaluated, so it learns nothing about the rules;
//   - only HTTP, HTTPS and CONNECT, only to the allowed destination ports;
//   - no destination inside the denied ranges (loopback, link-local and the cloud metadata
//     server, private and shared ranges, ...), refused by address before Squid connects;
//   - nothing that reveals the client (X-Forwarded-For, Via, Forwarded are removed, also
//     when the client sent them), no caching, no access log, no ICP or HTCP.
//
// Render is pure: the same Config gives the same bytes, so a re-rendering can be compared
// with what an instance runs. The directives used are those Squid 5.7 (Debian 12) and Squid
// 6.6 (the ubuntu/squid image) both accept; the tests run the rendering in the real Squid
// installed on the machine (see squidtest).
package squid
