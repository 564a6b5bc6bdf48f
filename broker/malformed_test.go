package broker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"github.com/nats-io/nats.go"
)

// TestMalformedReplies: a worker answering garbage never panics the client;
// every case ends in a typed error.
func TestMalformedReplies(t *testing.T) {
	wnc, cli := scriptedWorker(t, ClientConfig{IdleTimeout: 300 * time.Millisecond})
	msg := func(to string, h map[string]string, data string) *nats.Msg {
		m := nats.NewMsg(to)
		for k, v := range h {
			m.Header.Set(k, v)
		}
		m.Data = []byte(data)
		return m
	}
	// Each fake worker id answers with a scripted sequence.
	scripts := map[string][]map[string]string{
		"noseq":     {{HdrKind: KindHead, HdrStatus: "200"}},
		"badstatus": {{HdrKind: KindHead, HdrStatus: "abc", HdrSeq: "0"}},
		"datafirst": {{HdrKind: KindData, HdrSeq: "0"}},
		"gap":       {{HdrKind: KindHead, HdrStatus: "200", HdrSeq: "0"}, {HdrKind: KindData, HdrSeq: "2"}},
		"weirdkind": {{HdrKind: KindHead, HdrStatus: "200", HdrSeq: "0"}, {HdrKind: "zzz", HdrSeq: "1"}},
		"brokenend": {{HdrKind: KindHead, HdrStatus: "200", HdrSeq: "0"}, {HdrKind: KindEnd, HdrSeq: "1", HdrError: "engine died"}},
		"err500":    {{HdrKind: KindError, HdrStatus: "502", HdrSeq: "0", HdrError: "x"}},
	}
	for id, script := range scripts {
		script := script
		sub, err := wnc.Subscribe(ReqSubject(id), func(m *nats.Msg) {
			for _, h := range script {
				wnc.PublishMsg(msg(m.Reply, h, "x"))
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	wnc.Flush()
	f := func(id string, doErr, nextErr *Error) {
		t.Helper()
		s, err := cli.Do(context.Background(), id, &Request{Path: "/x"})
		if doErr != nil {
			if !errors.Is(err, doErr) {
				t.Fatalf("%s: Do err %v, want %v", id, err, doErr)
			}
			return
		}
		if err != nil {
			t.Fatalf("%s: Do: %v", id, err)
		}
		defer s.Close()
		for i := 0; i < 10; i++ {
			if _, err = s.Next(); err != nil {
				break
			}
		}
		if !errors.Is(err, nextErr) {
			t.Fatalf("%s: Next err %v, want %v", id, err, nextErr)
		}
	}
	f("noseq", ErrBroken, nil)
	f("badstatus", ErrBroken, nil)
	f("datafirst", ErrBroken, nil)
	f("gap", nil, ErrBroken)
	f("weirdkind", nil, ErrBroken)
	f("brokenend", nil, ErrBroken)
	f("err500", ErrEngine, nil)
}

// scriptedWorker starts a NATS server and returns a connection to play a
// worker by hand on it and a router-side client configured by cc (its
// Conn set here), both closed with the test.
func scriptedWorker(tb testing.TB, cc ClientConfig) (*nats.Conn, *Client) {
	tb.Helper()
	ns := testsrv.StartNATS(tb)
	wnc := connect(tb, ns.URL)
	cc.Conn = connect(tb, ns.URL)
	cli, err := NewClient(cc)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return wnc, cli
}
