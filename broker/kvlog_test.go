package broker

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/infera/infera/internal/logx"
	"github.com/infera/infera/internal/testsrv"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A malformed KV event is logged by what was wrong with it, never with the
// publisher's bytes (the subject's worker id, the Infera-Seq value): they
// reached the log line as sent.
func TestAMalformedKVEventsLogLineCarriesNoPublisherBytes(t *testing.T) {
	var logs lockedBuf
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	oldThrottle := badKVLog
	badKVLog = &logx.Throttle{}
	t.Cleanup(func() { badKVLog = oldThrottle })

	ns := testsrv.StartNATS(t)
	pnc, rnc := connect(t, ns.URL), connect(t, ns.URL)
	sub, err := SubscribeKVEvents(rnc, func(string, uint64, []byte, uint64, []byte) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	rnc.Flush()
	const marker = "PUBLISHERBYTES"
	for _, c := range []struct{ worker, seq string }{{"w1", "7" + marker}, {"w1." + marker + "$", "7"}} {
		m := nats.NewMsg(KVEventsSubject(c.worker))
		m.Header.Set(HdrSeq, c.seq)
		m.Data = []byte("x")
		if err := pnc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	pnc.Flush()
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(logs.String(), "dropping malformed KV event") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("two malformed events, logged: %s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s := logs.String(); strings.Contains(s, marker) {
		t.Fatalf("the publisher's bytes reached the log: %s", s)
	}
}
