//go:build !race

package main

// raceEnabled: the race detector changes what a test allocates.
const raceEnabled = false
