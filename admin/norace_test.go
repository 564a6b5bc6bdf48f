//go:build !race

package admin

// raceEnabled: the race detector changes what a test allocates.
const raceEnabled = false
