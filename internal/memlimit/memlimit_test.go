package memlimit

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseCgroupLimit(t *testing.T) {
	f := func(in string, want uint64, wantErr bool) {
		t.Helper()
		got, err := parseCgroupLimit([]byte(in))
		if (err != nil) != wantErr || got != want {
			t.Fatalf("%q: %d %v", in, got, err)
		}
	}
	f("max\n", 0, false)
	f("", 0, false)
	f("1073741824\n", 1<<30, false)
	f("9223372036854771712", 0, false) // v1 "unlimited"
	f("lots", 0, true)
	f("-1", 0, true)
}

func TestParseMeminfo(t *testing.T) {
	f := func(in string, want uint64, wantErr bool) {
		t.Helper()
		got, err := parseMeminfo([]byte(in))
		if (err != nil) != wantErr || got != want {
			t.Fatalf("%q: %d %v", in, got, err)
		}
	}
	f("MemTotal:       16303428 kB\nMemFree: 1 kB\n", 16303428*1024, false)
	f("MemFree: 1 kB\n", 0, true)
	f("MemTotal: x kB\n", 0, true)
	f("MemTotal:", 0, true)
}

func TestReadLimit(t *testing.T) {
	dir := t.TempDir()
	meminfo := filepath.Join(dir, "meminfo")
	write := func(name, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("meminfo", "MemTotal: 8388608 kB\n") // 8 GiB
	f := func(root string, want uint64) {
		t.Helper()
		got, err := readLimit(root, meminfo)
		if err != nil || got != want {
			t.Fatalf("%s: %d %v", root, got, err)
		}
	}
	f(filepath.Join(dir, "none"), 8<<30) // no cgroup: host memory
	write("v2/memory.max", "2147483648\n")
	f(filepath.Join(dir, "v2"), 2<<30)
	write("v2max/memory.max", "max\n")
	f(filepath.Join(dir, "v2max"), 8<<30)
	write("v1/memory/memory.limit_in_bytes", "1073741824\n")
	f(filepath.Join(dir, "v1"), 1<<30)
	write("big/memory.max", "17179869184\n") // above host: host wins
	f(filepath.Join(dir, "big"), 8<<30)
	// The real reader works on this machine.
	proc, limit, err := Read()
	if err != nil || proc == 0 || limit == 0 {
		t.Fatalf("Read: %d %d %v", proc, limit, err)
	}
}
