// Package benchmarks holds the benchmarks that measure the whole system, or one of its
// processes, on real parts: a Temporal dev server, a kube-apiserver with the CRD, the test
// stack of internal/stack, real forward proxies and Squid, all on loopback. They are kept
// apart from the end-to-end tests of internal/e2e because they answer another question
// (how fast, how much, against which baseline, rather than whether it works) and run for
// minutes each; none is part of make test. The benchmarks of a single package stay beside
// it (discovery, activities/probe).
//
// Each *_bench_test.go file opens with what it measures and which table of
// docs/benchmarks.md its figures feed; the figures there come with the command that
// produced them. Run one with
//
//	go test ./internal/benchmarks -run '^$' -bench <name> -benchtime 1x -timeout 60m
//
// or all of them, with the single-package ones, with make bench. Environment variables
// named in each benchmark's comment change its fleet, load or window.
//
// The servers start only when -bench is given (TestMain), so go test ./... runs this
// package in a moment. The gateway benchmarks run the test binary again as helper
// processes (TestGatewayBenchHelper), which need no servers either.
package benchmarks
