//go:build !race

package proxy

// raceEnabled: the race detector is on (exhaustive tests sample).
const raceEnabled = false
