//go:build !race

package config

// raceEnabled: the race detector changes what a test allocates.
const raceEnabled = false
