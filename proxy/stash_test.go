package proxy

import (
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A worker's error answer (5xx, 429) is kept aside while another worker is
// tried, and relayed when it is the last answer there is. It was kept only
// when it came in one read: a body in several TCP segments or chunks (an
// engine that writes its chunked body's end on its own) gave the client a
// generic 502 instead of the engine's answer.
func TestAWorkersErrorAnswerSplitAcrossReadsIsRelayedWhenItIsTheLast(t *testing.T) {
	body := `{"error":{"message":"the engine is full: retry in 2 s","type":"rate_limit_error","code":"engine_full"}}`
	chunked := func(status string) []string {
		head := "HTTP/1.1 " + status + "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
		var parts []string
		for i, p := range splitParts(body, 3) {
			c := strconv.FormatInt(int64(len(p)), 16) + "\r\n" + p + "\r\n"
			if i == 0 {
				c = head + c
			}
			parts = append(parts, c)
		}
		return append(parts, "0\r\n\r\n")
	}
	sized := func(status string) []string {
		head := "HTTP/1.1 " + status + "\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
		p := splitParts(body, 2)
		return []string{head + p[0], p[1]}
	}
	big := strings.Repeat("x", 40<<10)
	bigBody := `{"error":{"message":"` + big + `","type":"server_error"}}`
	for _, tc := range []struct {
		name   string
		parts  []string
		status int
		want   string
	}{
		{"429 chunked, its end on its own", chunked("429 Too Many Requests"), 429, body},
		{"503 sized, in two segments", sized("503 Service Unavailable"), 503, body},
		{"500 of 40 KiB", append([]string{"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(bigBody)) + "\r\n\r\n"}, splitParts(bigBody, 4)...), 500, bigBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hits atomic.Int32
			w := splitAnswerEngine(t, &hits, 30*time.Millisecond, tc.parts...)
			r := startRouter(t, nil, nil, w)
			code, got := post(t, r.url+"/v1/chat/completions", chatBody)
			if code != tc.status || got != tc.want {
				t.Fatalf("got %d %.200s, want %d and the engine's body", code, got, tc.status)
			}
			if hits.Load() != 1 {
				t.Fatalf("the worker got %d requests", hits.Load())
			}
			noLoadLeft(t, r.fl)
		})
	}
}
