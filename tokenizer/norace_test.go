//go:build !race

package tokenizer

// raceEnabled: the race detector makes a tokenizer's load about ten times
// slower.
const raceEnabled = false
