// Package systest holds Sluice's system tests: each starts a whole node
// (embedded NATS, the four services, the HTTP API) in-process through
// node.Run, in front of a provider simulator (pkg/sim) on loopback, and
// drives it as a user would: over HTTP with the official SDKs and over
// NATS with pkg/client. They take seconds each, so `go test -short`
// skips them; .ci/run's full tier runs them.
//
// Its non-test files are the shared fixture, which cmd/sluice's tests of
// the command line and of the binary's processes use too: Start runs a
// node from a YAML configuration and stops it when the test ends,
// StartSim serves a simulator, Judged and WatchPlans hold what a
// provider saw against what admission planned, and Quiet (no job left in
// INTAKE, QUEUE or DISPATCH) is the end state after which no job can be
// tried again: a test proving a negative checks there, not after a sleep.
package systest
