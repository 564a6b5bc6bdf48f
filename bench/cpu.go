package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clkTck is USER_HZ, the unit of utime and stime in /proc/<pid>/stat (100
// on every Linux architecture Go supports).
const clkTck = 100

// procCPU returns utime+stime of pid and of its child processes that are
// still running (nginx's workers), in seconds, from /proc.
func procCPU(pid int) (float64, error) {
	u, st, err := procCPUSplit(pid)
	return u + st, err
}

// procCPUSplit is procCPU as user and system seconds.
func procCPUSplit(pid int) (user, sys float64, err error) {
	pids := append([]int{pid}, childPids(pid)...)
	for _, p := range pids {
		u, st, err := procTimes(p)
		if err != nil {
			if p == pid {
				return 0, 0, err
			}
			continue
		}
		user += float64(u) / clkTck
		sys += float64(st) / clkTck
	}
	return user, sys, nil
}

// procTimes returns utime and stime of process pid in clock ticks, from
// /proc/<pid>/stat.
func procTimes(pid int) (utime, stime int64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("cannot read CPU time of pid %d: %w", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	// After the name: state(3) ppid(4) ... utime(14) stime(15).
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return u, st, nil
}

// childPids lists the children of pid (from /proc/<pid>/task/*/children).
func childPids(pid int) []int {
	var out []int
	tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + t.Name() + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}
