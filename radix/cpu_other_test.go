//go:build !unix

package radix

import "time"

func processCPU() time.Duration { return 0 }
