// Package memlimit reads the process memory and the container memory limit
// (cgroup v2 or v1, else the host) for bounds that must hold inside a
// container, such as the prefix index's memory threshold.
package memlimit

import (
	"bytes"
	"fmt"
	"os"
	"runtime/metrics"
	"strconv"
	"sync"
	"time"
)

// Read returns the process memory (Go runtime memory mapped and not
// released to the OS, which tracks RSS for a Go process) and the memory
// limit of the container: cgroup v2 memory.max, else cgroup v1
// memory.limit_in_bytes, capped by the host's MemTotal (the fallback when
// no cgroup limit is set). The limit is cached for a minute.
func Read() (process, limit uint64, err error) {
	process = processMemory()
	limit, err = containerLimit()
	return process, limit, err
}

var memSamples = []metrics.Sample{
	{Name: "/memory/classes/total:bytes"},
	{Name: "/memory/classes/heap/released:bytes"},
}
var memSamplesMu sync.Mutex

func processMemory() uint64 {
	memSamplesMu.Lock()
	defer memSamplesMu.Unlock()
	metrics.Read(memSamples)
	var total, released uint64
	if memSamples[0].Value.Kind() == metrics.KindUint64 {
		total = memSamples[0].Value.Uint64()
	}
	if memSamples[1].Value.Kind() == metrics.KindUint64 {
		released = memSamples[1].Value.Uint64()
	}
	if released > total {
		return 0
	}
	return total - released
}

var limitCache struct {
	sync.Mutex
	at    time.Time
	limit uint64
	err   error
}

func containerLimit() (uint64, error) {
	limitCache.Lock()
	defer limitCache.Unlock()
	if !limitCache.at.IsZero() && time.Since(limitCache.at) < time.Minute {
		return limitCache.limit, limitCache.err
	}
	limitCache.limit, limitCache.err = readLimit("/sys/fs/cgroup", "/proc/meminfo")
	limitCache.at = time.Now()
	return limitCache.limit, limitCache.err
}

// readLimit reads the cgroup limit under root and MemTotal from meminfo and
// returns the smaller known one.
func readLimit(root, meminfo string) (uint64, error) {
	host, herr := func() (uint64, error) {
		data, err := os.ReadFile(meminfo)
		if err != nil {
			return 0, fmt.Errorf("cannot read %s: %w", meminfo, err)
		}
		return parseMeminfo(data)
	}()
	cg := uint64(0)
	if data, err := os.ReadFile(root + "/memory.max"); err == nil {
		cg, _ = parseCgroupLimit(data)
	} else if data, err := os.ReadFile(root + "/memory/memory.limit_in_bytes"); err == nil {
		cg, _ = parseCgroupLimit(data)
	}
	switch {
	case cg > 0 && (herr != nil || cg < host):
		return cg, nil
	case herr != nil:
		return 0, herr
	}
	return host, nil
}

// parseCgroupLimit parses memory.max ("max" or bytes) or v1
// limit_in_bytes (a huge value means unlimited); 0 means no limit.
func parseCgroupLimit(data []byte) (uint64, error) {
	s := string(bytes.TrimSpace(data))
	if s == "max" || s == "" {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cannot parse cgroup memory limit %q: %w", s, err)
	}
	if v >= 1<<62 {
		return 0, nil
	}
	return v, nil
}

// parseMeminfo returns MemTotal from /proc/meminfo in bytes.
func parseMeminfo(data []byte) (uint64, error) {
	for _, line := range bytes.Split(data, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("MemTotal:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) == 0 {
			break
		}
		v, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cannot parse MemTotal %q: %w", f[0], err)
		}
		if len(f) > 1 && string(f[1]) == "kB" {
			v *= 1024
		}
		return v, nil
	}
	return 0, fmt.Errorf("no MemTotal in meminfo")
}
