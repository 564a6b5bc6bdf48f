//go:build linux && race

package sockio

import "syscall"

// Under the race detector the syscall package's Read and Write are used:
// they tell the detector that a write to a socket happens before the read
// of its bytes (the runtime's own connections do the same). Raw system calls
// would hide that edge, and a test that hands data to a server through a
// socket would see a false race.

func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return max(n, 0), errno(err)
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return max(n, 0), errno(err)
}

func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}
