//go:build race

package discovery

// raceEnabled: the race detector is on (long timing tests run without it).
const raceEnabled = true
