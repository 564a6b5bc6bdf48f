package bench

import (
	"bytes"
	"context"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alecthomas/kong"
)

func TestProcCPUReadsThisProcess(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Skip(err)
	}
	end := time.Now().Add(150 * time.Millisecond)
	x := 0
	for time.Now().Before(end) {
		x++
	}
	after, err := procCPU(os.Getpid())
	if err != nil || after <= before {
		t.Fatalf("CPU %v -> %v (%v) after 150 ms of spinning", before, after, err)
	}
}

// Spinning is user time: the split puts it there, not in system time.
func TestProcCPUSplitCountsSpinningAsUser(t *testing.T) {
	u0, s0, err := procCPUSplit(os.Getpid())
	if err != nil {
		t.Skip(err)
	}
	// Spin until 0.15 CPU-s of user time show (a busy machine gives the
	// spinner less of the wall clock), 5 s at most.
	var u1, s1 float64
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		end := time.Now().Add(50 * time.Millisecond)
		for x := 0; time.Now().Before(end); x++ {
		}
		if u1, s1, err = procCPUSplit(os.Getpid()); err != nil || u1-u0 >= 0.15 {
			break
		}
	}
	if err != nil || u1-u0 < 0.15 || s1-s0 > u1-u0 {
		t.Fatalf("user %v -> %v, system %v -> %v (%v) after spinning", u0, u1, s0, s1, err)
	}
}

func TestChatBodySize(t *testing.T) {
	for _, stream := range []bool{false, true} {
		b := chatBody(1024, stream)
		if len(b) != 1024 || !strings.HasSuffix(string(b), `"}]}`) || strings.Contains(string(b), `"stream":true`) != stream {
			t.Fatalf("stream=%v: %d bytes: %s", stream, len(b), b)
		}
	}
}

// A short end-to-end run of the proxy benchmark: the direct path, the
// naive fasthttp reference, the floors, the infera targets and a baseline binary, both
// kinds, CPU measured for every proxy.
func TestProxyBenchShortRun(t *testing.T) {
	if _, err := os.Stat("/usr/bin/wrk"); err != nil {
		if os.Getenv("INFERA_REQUIRE_SERVERS") != "" {
			t.Fatal("wrk not installed (make deps)")
		}
		t.Skip("wrk not installed")
	}
	bin := inferaBin(t)
	c := &ProxyCmd{Concurrency: 8, Duration: time.Second, Rounds: 1, StreamChunks: 4, PromptBytes: 512,
		InferaBin: bin, GoMaxProcs: 2, Nginx: "", Wrk: "/usr/bin/wrk", WrkThreads: 1, Kinds: []string{"json", "sse"}, Naive: true, Floors: true, BaselineBin: bin}
	rep, err := RunProxyBench(context.Background(), c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	seen, naive, baseline, floors := 0, 0, 0, 0
	for _, tg := range rep.Targets {
		// Every proxy's CPU is split into user and system time. A floor's
		// user time can be under one clock tick (10 ms) in a 1 s run (the
		// epoll floor's is about 0.01 s per 10k requests): only its sum is
		// checked; the others' user time is far above a tick.
		if math.Abs(tg.UserPer10k+tg.SysPer10k-tg.CPUPer10k) > 1e-9*max(1, tg.CPUPer10k) {
			t.Fatalf("user and system time do not add up to the CPU: %+v", tg)
		}
		if tg.CPUPer10k > 0 && !strings.HasSuffix(tg.Target, " floor") && (tg.UserPer10k <= 0 || tg.SysPer10k <= 0) {
			t.Fatalf("CPU not split into user and system time: %+v", tg)
		}
		if strings.HasSuffix(tg.Target, " floor") {
			floors++
			if tg.CPUPer10k <= 0 {
				t.Fatalf("no CPU measured: %+v", tg)
			}
		}
		if tg.RPS <= 0 || tg.Errors != 0 {
			t.Fatalf("%+v", tg)
		}
		if tg.Target == "naive fasthttp" {
			naive++
			if tg.CPUPer10k <= 0 {
				t.Fatalf("no CPU measured: %+v", tg)
			}
		}
		if tg.Target == "baseline round-robin" {
			baseline++
			if tg.CPUPer10k <= 0 {
				t.Fatalf("no CPU measured: %+v", tg)
			}
		}
		if strings.HasPrefix(tg.Target, "infera") {
			seen++
			if tg.CPUPer10k <= 0 {
				t.Fatalf("no CPU measured: %+v", tg)
			}
		}
	}
	if naive != 2 {
		t.Fatalf("%d naive fasthttp measurements, want 2 (one per kind)", naive)
	}
	if wantFloors := map[bool]int{true: 6, false: 4}[runtime.GOOS == "linux"]; floors != wantFloors {
		t.Fatalf("%d floor measurements, want %d", floors, wantFloors)
	}
	if baseline != 2 {
		t.Fatalf("%d measurements of the baseline binary, want 2 (one per kind)", baseline)
	}
	if seen != 4 {
		t.Fatalf("%d infera measurements, want 4 (2 policies x 2 kinds)", seen)
	}
	var b strings.Builder
	if err := WriteProxyTable(&b, rep); err != nil || !strings.Contains(b.String(), "CPU-s per 10k") || !strings.Contains(b.String(), "user / sys") {
		t.Fatalf("%v\n%s", err, b.String())
	}
	// The columns are as wide as their cells (the title line is not one).
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n")[1:] {
		if pad := len(line) - len(strings.TrimLeft(line, " ")); pad > 4 {
			t.Fatalf("first column padded by %d spaces:\n%s", pad, b.String())
		}
	}
}

// The same-round column divides each round's CPU figure by nginx's in that
// round and reports the median and range of those ratios, which a drift of
// the whole machine between rounds does not move.
func TestPairedCPURatioCancelsDriftBetweenRounds(t *testing.T) {
	nginx := ProxyTarget{Target: "nginx", Kind: "json", Runs: [][2]float64{{0.30, 1}, {0.45, 1}, {0.60, 1}}}
	// Always 1.2x nginx in its own round, while the machine drifts.
	inf := ProxyTarget{Target: "infera round-robin", Kind: "json", Runs: [][2]float64{{0.36, 1}, {0.54, 1}, {0.72, 1}}}
	if got := pairedCPU(inf, nginx); got != "1.20x (1.20-1.20)" {
		t.Fatalf("paired ratio %q, want 1.20x (1.20-1.20)", got)
	}
	// The direct path has no CPU figure; nginx compared with itself is 1.
	if got := pairedCPU(ProxyTarget{Runs: [][2]float64{{0, 5}, {0, 6}}}, nginx); got != "-" {
		t.Fatalf("direct path: %q", got)
	}
	if got := pairedCPU(nginx, nginx); got != "1.00x (1.00-1.00)" {
		t.Fatalf("nginx against itself: %q", got)
	}
	rep := &ProxyReport{Rounds: 3, Duration: 8, Concurrency: 64, Targets: []ProxyTarget{nginx, inf}}
	var b strings.Builder
	if err := WriteProxyTable(&b, rep); err != nil || !strings.Contains(b.String(), "1.20x (1.20-1.20)") || !strings.Contains(b.String(), "same round") {
		t.Fatalf("%v\n%s", err, b.String())
	}
}

// Ctrl-C stops `infera bench proxy` cleanly: wrk is killed, nginx and the
// proxies are stopped and the temp dir is removed. The command ran with no
// signal handling, so SIGINT ended it at once: the nginx master died of
// its Pdeathsig and its workers were left running, orphaned, holding their
// listening port, with the temp dir (nginx.conf, logs, post.lua) left in
// /tmp.
func TestProxyBenchInterruptLeavesNoNginxOrTempDir(t *testing.T) {
	if args := os.Getenv("INFERA_BENCH_TEST_PROXY_ARGS"); args != "" {
		var cli struct {
			Bench Cmd `cmd:""`
		}
		p, err := kong.New(&cli)
		if err != nil {
			t.Fatal(err)
		}
		kctx, err := p.Parse(append([]string{"bench", "proxy"}, strings.Fields(args)...))
		if err != nil {
			t.Fatal(err)
		}
		_ = kctx.Run()
		return
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	for _, b := range []string{"/usr/bin/wrk", "/usr/sbin/nginx"} {
		if _, err := os.Stat(b); err != nil {
			t.Skipf("%s not installed", b)
		}
	}
	bin := inferaBin(t)
	tmp := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestProxyBenchInterruptLeavesNoNginxOrTempDir$")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "INFERA_BENCH_TEST_PROXY_ARGS=--infera-bin "+bin+
		" --no-naive --no-floors --kinds json --duration 30s --rounds 1 --warmup 0s --concurrency 4 --wrk-threads 1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var workers []int
	defer func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
		for _, pid := range workers {
			if procAlive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}()
	// Wait for wrk to run against a target (nginx is up by then) and note
	// the nginx workers.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("wrk never ran; output:\n%s", out.String())
		}
		select {
		case <-done:
			t.Fatalf("bench proxy ended early; output:\n%s", out.String())
		default:
		}
		master, wrk := 0, false
		for pid, cl := range procCmdlines() {
			if strings.Contains(cl, tmp) && strings.HasPrefix(cl, "nginx: master") {
				master = pid
			}
			if strings.HasPrefix(cl, "/usr/bin/wrk") && strings.Contains(cl, tmp) {
				wrk = true
			}
		}
		if master != 0 && wrk {
			workers = procChildren(master)
			if len(workers) > 0 {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("bench proxy still runs 20 s after Ctrl-C; output:\n%s", out.String())
	}
	time.Sleep(200 * time.Millisecond) // the workers' exit
	for _, pid := range workers {
		if procAlive(pid) {
			t.Errorf("nginx worker %d still runs after bench proxy was interrupted", pid)
		}
	}
	if ents, _ := os.ReadDir(tmp); len(ents) > 0 {
		t.Errorf("bench proxy left %s in %s", ents[0].Name(), tmp)
	}
}

// procCmdlines maps every process's pid to its command line (arguments
// joined by spaces).
func procCmdlines() map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		out[pid] = strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
	}
	return out
}

// procStat returns a process's state and parent pid from /proc/PID/stat.
func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0][0], ppid, true
}

func procChildren(parent int) []int {
	var out []int
	for pid := range procCmdlines() {
		if _, pp, ok := procStat(pid); ok && pp == parent {
			out = append(out, pid)
		}
	}
	return out
}

// procAlive reports whether pid runs (not gone, not a zombie).
func procAlive(pid int) bool {
	st, _, ok := procStat(pid)
	return ok && st != 'Z' && st != 'X'
}

// With --api-key, the infera targets started with --serve-arg=--api-key are
// checked for readiness and loaded by wrk with the key: they were reported
// "not ready" (401) before; the direct path gets no key.
func TestProxyBenchAPIKeyReachesInferaTargets(t *testing.T) {
	if _, err := os.Stat("/usr/bin/wrk"); err != nil {
		if os.Getenv("INFERA_REQUIRE_SERVERS") != "" {
			t.Fatal("wrk not installed (make deps)")
		}
		t.Skip("wrk not installed")
	}
	const key = "bench-proxy-secret-key"
	c := &ProxyCmd{Concurrency: 4, Duration: time.Second, Rounds: 1, StreamChunks: 2, PromptBytes: 256,
		InferaBin: inferaBin(t), GoMaxProcs: 2, Nginx: "", Wrk: "/usr/bin/wrk", WrkThreads: 1, Kinds: []string{"json"},
		ServeArg: []string{"--api-key=" + key}, APIKey: key}
	var log strings.Builder
	rep, err := RunProxyBench(context.Background(), c, &log)
	if err != nil {
		t.Fatal(err)
	}
	infera := 0
	for _, tg := range rep.Targets {
		if tg.RPS <= 0 || tg.Errors != 0 {
			t.Fatalf("%+v", tg)
		}
		if strings.HasPrefix(tg.Target, "infera") {
			infera++
		}
	}
	if infera != 2 {
		t.Fatalf("%d infera measurements, want 2", infera)
	}
	if strings.Contains(log.String(), key) {
		t.Fatalf("the key was printed:\n%s", log.String())
	}
	if s := wrkScript([]byte(`{}`), ""); strings.Contains(s, "Authorization") {
		t.Fatalf("a target without a key got one:\n%s", s)
	}
	if s := wrkScript([]byte(`{}`), key); !strings.Contains(s, `wrk.headers["Authorization"] = "Bearer `+key+`"`) {
		t.Fatalf("no key header:\n%s", s)
	}
}
