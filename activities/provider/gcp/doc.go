// Package gcp is the Compute Engine provider: one VM per Proxy instance, driven through the
// Compute REST API with four calls (instances insert, get, delete and aggregatedList).
// Operations are never waited on: readiness is observed by polling Get, exactly as for the
// other providers, so a worker crash mid-create loses nothing.
package gcp
