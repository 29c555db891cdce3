//go:build race

package workflows

// raceEnabled is true in a -race build: the soak then skips, and make test runs it once
// more without the race detector, where it takes seconds instead of minutes.
const raceEnabled = true
