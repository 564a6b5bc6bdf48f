// Package sockio reads and writes TCP sockets without telling the Go
// scheduler about each system call.
//
// The runtime wraps every read and write on a network connection in
// entersyscall/exitsyscall so that a call that blocks gives its P to another
// thread. Sockets under the netpoller are non-blocking, so these calls never
// block; but on a virtual machine a loopback write can take tens of
// microseconds (the kernel runs the receiving side's TCP stack inside the
// sender's write), longer than the 20 µs after which the sysmon thread
// retakes the P and wakes another thread to run it. On the proxy's path that
// hand-off costs more CPU than the work it saves: a futex wake-up, a thread
// switch, and sysmon staying at its 20 µs polling period.
//
// Conn issues read(2) and write(2) with syscall.RawSyscall from inside
// syscall.RawConn's Read and Write, which keep the netpoller's readiness
// waits and the connection's deadlines: a call that would block (EAGAIN)
// parks the goroutine exactly as net.Conn's own Read and Write do. Under
// the race detector it uses syscall.Read and Write instead, which tell the
// detector that socket I/O orders memory.
//
// Two more savings per request: deadlines are armed lazily (a later one
// is recorded, and re-armed only when the armed one fires), and
// WriteAwaitReply writes a request and waits for the reply without the
// read that would find nothing.
package sockio
