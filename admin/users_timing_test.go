package admin

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/infera/infera/config"
)

// usersWithKeys is a config file with users u0..u(n-1), each with one key
// hash, and a quota template they are bound to: a users section about as
// large per user as a real one (about 200 bytes).
func usersWithKeys(b testing.TB, n int) string {
	var sb strings.Builder
	sb.WriteString(`{"user_limit":{"templates":[{"name":"standard","rate":{"enabled":true,"rpm":60}}]},"users":[`)
	for i, h := range keyHashes(b, n) {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"name":"user-%05d@example.com","template":"standard","keys":[%s]}`, i, h)
	}
	sb.WriteString("]}")
	return sb.String()
}

// BenchmarkCreateUserAt10000Users is one POST /api/users that makes the
// 10,000th user, through the admin handler: the write, its storage (the
// config file, or Redis on loopback) and its audit entry. Before each
// write the store goes back to the 9,999 users (untimed). doc-bytes is the
// stored document (the file, or Redis's doc field) after the write.
func BenchmarkCreateUserAt10000Users(b *testing.B) {
	// The audit line is still formatted, then dropped: go test's output
	// stays readable.
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer slog.SetDefault(old)
	doc := usersWithKeys(b, config.MaxAPIUsers-1)
	b.Run("file", func(b *testing.B) {
		e := newEnv(b, envOpts{file: doc})
		benchCreateUser(b, e, func() int64 {
			fi, err := os.Stat(e.path)
			if err != nil {
				b.Fatal(err)
			}
			return fi.Size()
		})
	})
	b.Run("redis", func(b *testing.B) {
		rs := startRedis(b)
		e := newEnv(b, envOpts{state: rs.url(), file: doc})
		c := redis.NewClient(&redis.Options{Addr: rs.addr()})
		defer c.Close()
		benchCreateUser(b, e, func() int64 {
			n, err := c.HStrLen(context.Background(), "infera:admin:data", "doc").Result()
			if err != nil {
				b.Fatal(err)
			}
			return n
		})
	})
}

func benchCreateUser(b *testing.B, e *env, docBytes func() int64) {
	h := e.a.Handler()
	base := e.store.Load()
	if len(base.Users) != config.MaxAPIUsers-1 {
		b.Fatalf("%d users", len(base.Users))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		e.store.Replace(base, e.store.Version())
		e.a.audit.drain()
		req := httptest.NewRequest("POST", "http://127.0.0.1/api/users", strings.NewReader(`{"name":"bench-new","template":"standard"}`))
		req.Header.Set("Authorization", "Bearer "+testKey)
		rec := httptest.NewRecorder()
		b.StartTimer()
		h.ServeHTTP(rec, req)
		e.a.audit.drain() // the write's audit entry is part of its cost
		b.StopTimer()
		if rec.Code != http.StatusCreated {
			b.Fatalf("create: %d %.300s", rec.Code, rec.Body)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(docBytes()), "doc-bytes")
}
