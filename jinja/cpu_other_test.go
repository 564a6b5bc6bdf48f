//go:build !unix

package jinja

import "time"

func processCPU() time.Duration { return 0 }
