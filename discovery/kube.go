package discovery

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/infera/infera/fleet"
)

// DefaultAnnotation is the Pod annotation holding the worker record.
const DefaultAnnotation = "infera.io/worker"

// KubeWatcherConfig configures Kubernetes discovery.
type KubeWatcherConfig struct {
	// Namespace to watch; empty watches all namespaces.
	Namespace string
	// LabelSelector selects worker Pods (--k8s-label-selector).
	LabelSelector string
	// Annotation holds the record; default DefaultAnnotation.
	Annotation string
	// WatchTimeout is the least server-side timeout of one watch request
	// (timeoutSeconds: the API server ends the watch then, and it is
	// resumed from the last resource version); default 5m. Each watch
	// asks for one drawn at random in [WatchTimeout, 2*WatchTimeout), in
	// whole seconds (at least one), as client-go's reflector draws it, so
	// that routers started together do not re-watch at the same moments.
	// A watch still open its timeout and a tenth more (at least a
	// second) after it began is cut: its API server stopped answering
	// with the connection left up. A quiet watch is never cut before: an
	// API server sends bookmarks at its discretion, and one with its
	// watch cache off sends none.
	WatchTimeout time.Duration
	// RequestTimeout bounds a list; default 30s.
	RequestTimeout time.Duration
}

// watchTimeout draws the server-side timeout of one watch in [least,
// 2*least), in whole seconds and at least one, as client-go's reflector
// does (minWatchTimeout * (1 + rand)).
func watchTimeout(least time.Duration) time.Duration {
	t := time.Duration(float64(least) * (1 + rand.Float64()))
	return max(t.Truncate(time.Second), time.Second)
}

// watchBound is how long a watch of server-side timeout t may stay open
// before it is cut: t and a tenth more, at least a second.
func watchBound(t time.Duration) time.Duration { return t + max(t/10, time.Second) }

// KubeWatcher lists and watches worker Pods and keeps a Sink in step. A
// Pod is routed only when it is Running, Ready, not terminating and
// carries a valid record in its annotation.
type KubeWatcher struct {
	cfg  KubeWatcherConfig
	c    *kubeClient
	sink Sink
	st   *backendStats
	h    *health

	byPod map[string]fleet.Record // namespace/name -> record routed; loop only
	// owner maps a worker id to the Pod (namespace/name) whose record the
	// sink holds, when several routed Pods advertise it; loop only.
	owner map[string]string
	rv    string
	// servedAt is when the API server answered the last watch 200,
	// zero if it did not; loop only.
	servedAt time.Time

	workers workerCount
	// denied holds the API server's refusal of the watch (403) while
	// the fleet is refreshed by relists alone; empty when watching.
	denied atomic.Pointer[string]
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewKubeWatcher returns a watcher using kc; Start runs it.
func NewKubeWatcher(kc *KubeConfig, cfg KubeWatcherConfig, sink Sink) (*KubeWatcher, error) {
	c, err := newKubeClient(kc)
	if err != nil {
		return nil, err
	}
	if cfg.Annotation == "" {
		cfg.Annotation = DefaultAnnotation
	}
	if cfg.WatchTimeout <= 0 {
		cfg.WatchTimeout = 5 * time.Minute
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	return &KubeWatcher{cfg: cfg, c: c, sink: sink, st: statsFor(BackendKubernetes), h: newHealth(), byPod: map[string]fleet.Record{}}, nil
}

// Start runs the list/watch loop in the background.
func (w *KubeWatcher) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	w.wg.Add(1)
	go func() { defer w.wg.Done(); w.loop(ctx) }()
}

// WaitSynced waits for the first successful list.
func (w *KubeWatcher) WaitSynced(ctx context.Context) error {
	return w.h.waitSynced(ctx, "kubernetes")
}

// Close stops the watcher.
func (w *KubeWatcher) Close() {
	if w.cancel != nil {
		w.cancel()
	}
	w.wg.Wait()
}

// Health reports whether the API server answers; detail says what is served.
func (w *KubeWatcher) Health() (ok bool, detail string) {
	ok, since, lastErr, synced := w.h.get()
	n := &w.workers
	switch {
	case ok && w.denied.Load() != nil:
		// Not down (the lists work), but changes are seen only by the
		// relists: /health says degraded.
		return false, fmt.Sprintf("kubernetes: the watch on pods is forbidden (%s): RBAC needs the watch verb on pods in %s; serving pods %q from relists every %s (%s)",
			*w.denied.Load(), w.nsName(), w.cfg.LabelSelector, forbiddenRelist, n)
	case ok:
		return true, fmt.Sprintf("kubernetes: watching pods %q in %s (%s)", w.cfg.LabelSelector, w.nsName(), n)
	case !synced:
		return false, fmt.Sprintf("kubernetes: API never reached (%s); no workers known", lastErr)
	default:
		return false, fmt.Sprintf("kubernetes API unreachable since %s (%s); serving last known list of %s",
			since.UTC().Format(time.RFC3339), lastErr, n)
	}
}

func (w *KubeWatcher) nsName() string {
	if w.cfg.Namespace == "" {
		return "all namespaces"
	}
	return "namespace " + w.cfg.Namespace
}

func (w *KubeWatcher) setHealth(ok bool, err error) {
	if ok {
		w.st.healthy.Store(1)
	} else {
		w.st.healthy.Store(0)
	}
	if w.h.set(ok, err) {
		if ok {
			slog.Info("kubernetes discovery: API reachable again")
		} else {
			slog.Warn("kubernetes discovery: API unreachable, serving last known workers", "workers", w.workers.routed.Load(), "err", err)
		}
	}
}

var errGone = errors.New("resource version too old (410 Gone)")

// errShortWatch is a watch that ended, with no event, less than
// shortWatch after it began.
var errShortWatch = errors.New("the watch ended less than a second after it began, with no event")

// errOverdueWatch is a watch still open past watchBound of its
// server-side timeout: the API server stopped answering.
var errOverdueWatch = errors.New("watch overdue")

const shortWatch = time.Second

// kubeBackoffReset is how long a watch must have been served (answered
// 200) for the retry delay to start over when it ends, whatever ended
// it: client-go's reflector resets its backoff after 2 min without one
// (wait.Backoff.DelayWithReset). A variable for tests.
var kubeBackoffReset = 2 * time.Minute

// errWatchThrottled is a watch the API server refused with 429 Too Many
// Requests (API Priority and Fairness shedding load), or ended with an
// ERROR event saying it is shedding load or timed out (429 or reason
// TooManyRequests, 504 ServerTimeout, 500 InternalError): asked again
// from the same resource version after a delay, not relisted.
var errWatchThrottled = errors.New("watch throttled")

// errWatchRefused is a watch request whose connection was refused: the
// API server is restarting, or not up yet.
var errWatchRefused = errors.New("watch refused")

// errStreamCut is a watch stream whose connection failed mid-way (see
// streamCut): resumed from the last resource version, not relisted.
var errStreamCut = errors.New("watch stream cut")

// streamCut reports whether err, met reading a watch stream, is its
// connection ending or failing rather than bytes that are no watch event:
// an end of stream (whole or mid-event), a reset, a closed connection, a
// timeout (ETIMEDOUT: TCP keepalive gave the peer up), any error of the
// connection (*net.OpError). These are what apimachinery's IsProbableEOF
// and IsTimeout take for the end of a watch (watch.StreamWatcher); an
// event that does not decode ends it with an error, which relists.
func streamCut(err error) bool {
	var op *net.OpError
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.As(err, &op) || (errors.As(err, &ne) && ne.Timeout())
}

// errWatchForbidden is a watch the API server refused with 403 (RBAC
// grants list but not watch).
var errWatchForbidden = errors.New("watch forbidden")

// forbiddenRelist is how often the fleet is relisted while the watch is
// forbidden; a variable for tests.
var forbiddenRelist = 10 * time.Second

// setDenied records that the watch is forbidden (err) or allowed again
// (nil), logging the change.
func (w *KubeWatcher) setDenied(err error) {
	if err == nil {
		if w.denied.Swap(nil) != nil {
			w.st.degraded.Store(0)
			slog.Info("kubernetes discovery: the watch on pods is allowed again")
		}
		return
	}
	msg := strings.TrimPrefix(err.Error(), errWatchForbidden.Error()+": ")
	if w.denied.Swap(&msg) == nil {
		w.st.degraded.Store(1)
		slog.Warn("kubernetes discovery: the API server forbids watching pods; RBAC needs the watch verb on pods (list alone is granted): serving from relists",
			"scope", w.nsName(), "every", forbiddenRelist, "err", err)
	}
}

func (w *KubeWatcher) loop(ctx context.Context) {
	var delay time.Duration
	var listedAt time.Time
	needList := true
	for ctx.Err() == nil {
		if needList {
			if err := w.list(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				w.setHealth(false, err)
				delay = backoff(delay, 10*time.Second)
				sleep(ctx, delay)
				continue
			}
			w.setHealth(true, nil)
			needList, listedAt = false, time.Now()
		}
		err := w.watch(ctx)
		if ctx.Err() != nil {
			return
		}
		if !w.servedAt.IsZero() && time.Since(w.servedAt) > kubeBackoffReset {
			// The API server served this watch for the reset period:
			// whatever ended it, it is retried after the first delay,
			// not the one grown while the server flapped before.
			delay = 0
		}
		switch {
		case err == nil:
			delay = 0 // server closed the watch normally: resume from rv
		case errors.Is(err, errOverdueWatch):
			// Resumed from rv at once (it took the watch's whole
			// bound); Health says the API is unreachable until it
			// answers.
			w.st.log.Warn("kubernetes discovery: the watch ran past its server-side timeout; resuming it", "err", err)
			w.setHealth(false, err)
			delay = 0
		case errors.Is(err, errShortWatch):
			// Resume from rv, but not in a tight loop (client-go's "very
			// short watch").
			w.st.log.Warn("kubernetes discovery: watch ended at once; retrying with a delay", "err", err)
			delay = backoff(delay, 10*time.Second)
			sleep(ctx, delay)
		case errors.Is(err, errGone) && time.Since(listedAt) < shortWatch:
			// The resource version of the list just made is already
			// too old: relisting at once looped, thousands of lists a
			// second against the API server.
			w.st.relists.Inc()
			w.st.log.Warn("kubernetes discovery: the listed resource version expired at once; relisting with a delay", "err", err)
			needList = true
			delay = backoff(delay, 10*time.Second)
			sleep(ctx, delay)
		case errors.Is(err, errWatchThrottled):
			// Asked again from rv after a growing delay, as client-go
			// does (a 429 or an internal error, answered or as an ERROR
			// event): a relist is the load the server asked to shed.
			w.st.log.Warn("kubernetes discovery: the API server throttled the watch; retrying it with a delay", "err", err)
			delay = backoff(delay, 10*time.Second)
			sleep(ctx, delay)
		case errors.Is(err, errWatchRefused):
			// The API server is down or restarting: asked again from
			// rv after a growing delay, as client-go does; a relist
			// from every router is what a server just back up needs
			// least, and its history since rv is usually still there
			// (else the watch is answered 410, which relists). Health
			// says the API is unreachable until it answers.
			w.st.log.Warn("kubernetes discovery: the API server refused the watch's connection; retrying it with a delay", "err", err)
			delay = backoff(delay, 10*time.Second)
			sleep(ctx, delay)
		case errors.Is(err, errStreamCut):
			// Resumed from rv at once: a relist from every router
			// whose connection to the API server broke is the load a
			// server just reachable again needs least, and its history
			// since rv is usually still there (else the watch is
			// answered 410, which relists). The delay is kept: a cut
			// is no sign of health (one served kubeBackoffReset
			// started it over above).
			w.st.log.Warn("kubernetes discovery: the watch stream was cut; resuming it from its resource version", "rv", w.rv, "err", err)
		case errors.Is(err, errWatchForbidden):
			// Served by relists (the list is allowed), reported by
			// Health until a watch is allowed again.
			w.st.relists.Inc()
			w.setDenied(err)
			needList, delay = true, 0
			sleep(ctx, forbiddenRelist)
		case errors.Is(err, errGone):
			w.st.relists.Inc()
			slog.Info("kubernetes discovery: relisting", "reason", err)
			needList, delay = true, 0
		default:
			w.st.relists.Inc()
			slog.Warn("kubernetes discovery: watch failed, relisting", "err", err)
			needList = true
			delay = backoff(delay, 10*time.Second)
			sleep(ctx, delay)
		}
	}
}

func (w *KubeWatcher) podsURL(q url.Values) string {
	p := "/api/v1/pods"
	if w.cfg.Namespace != "" {
		p = "/api/v1/namespaces/" + url.PathEscape(w.cfg.Namespace) + "/pods"
	}
	if w.cfg.LabelSelector != "" {
		q.Set("labelSelector", w.cfg.LabelSelector)
	}
	return w.c.base + p + "?" + q.Encode()
}

// Pod is the part of a Kubernetes Pod discovery reads.
type kubePod struct {
	Metadata struct {
		Name              string            `json:"name"`
		Namespace         string            `json:"namespace"`
		ResourceVersion   string            `json:"resourceVersion"`
		DeletionTimestamp *string           `json:"deletionTimestamp"`
		Annotations       map[string]string `json:"annotations"`
	} `json:"metadata"`
	Status struct {
		Phase      string `json:"phase"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

type kubePodList struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []kubePod `json:"items"`
}

type kubeStatus struct {
	Kind    string `json:"kind"`
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

type kubeEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

func (p *kubePod) key() string { return p.Metadata.Namespace + "/" + p.Metadata.Name }

// record returns the Pod's record and whether it is routable; bad is set
// when an annotation is present but invalid.
func (w *KubeWatcher) record(p *kubePod) (rec fleet.Record, routable bool, bad error) {
	raw, has := p.Metadata.Annotations[w.cfg.Annotation]
	if !has {
		return rec, false, nil
	}
	rec, err := fleet.ParseRecord([]byte(raw))
	if err != nil {
		return rec, false, err
	}
	if p.Metadata.DeletionTimestamp != nil || p.Status.Phase != "Running" {
		return rec, false, nil
	}
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return rec, c.Status == "True", nil
		}
	}
	return rec, false, nil
}

func apiError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var st kubeStatus
	if json.Unmarshal(b, &st) == nil && st.Message != "" {
		if resp.StatusCode == http.StatusGone {
			return fmt.Errorf("%w: %s", errGone, st.Message)
		}
		return fmt.Errorf("kubernetes API %s: %s (%s)", resp.Status, st.Message, st.Reason)
	}
	if resp.StatusCode == http.StatusGone {
		return errGone
	}
	return fmt.Errorf("kubernetes API %s", resp.Status)
}

func (w *KubeWatcher) list(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, w.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(lctx, http.MethodGet, w.podsURL(url.Values{}), nil)
	if err != nil {
		return fmt.Errorf("cannot build list request: %w", err)
	}
	resp, err := w.c.do(req)
	if err != nil {
		return fmt.Errorf("cannot list pods: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("cannot list pods: %w", apiError(resp))
	}
	var pl kubePodList
	if err := json.NewDecoder(resp.Body).Decode(&pl); err != nil {
		return fmt.Errorf("cannot decode pod list: %w", err)
	}
	recs := make([]fleet.Record, 0, len(pl.Items))
	clear(w.byPod)
	// One record per id: with two Ready Pods advertising one id (a rollout
	// with a fixed --id) the sink got both, and the second replaced the
	// first, the worker made anew (KV entries, breaker and counters reset)
	// twice on every relist. The Pod the sink holds keeps the id, else the
	// last one listed (as the sink kept before).
	prev := w.owner
	w.owner = map[string]string{}
	at := map[string]int{} // id -> index in recs
	for i := range pl.Items {
		p := &pl.Items[i]
		rec, ok, bad := w.record(p)
		if bad != nil {
			w.st.badRecord(p.key(), bad)
		}
		if !ok {
			continue
		}
		w.byPod[p.key()] = rec
		j, dup := at[rec.ID]
		switch {
		case !dup:
			at[rec.ID] = len(recs)
			recs = append(recs, rec)
			w.owner[rec.ID] = p.key()
		case prev[rec.ID] != w.owner[rec.ID]:
			recs[j] = rec
			w.owner[rec.ID] = p.key()
		}
	}
	for _, err := range w.sink.Sync(recs) {
		w.st.badRecord("sync", err)
		// Not routed, as a refused watch event's Pod is not.
		if se := (*fleet.SkippedError)(nil); errors.As(err, &se) {
			for k, r := range w.byPod {
				if r.ID == se.ID {
					delete(w.byPod, k)
				}
			}
			delete(w.owner, se.ID)
		}
	}
	w.rv = pl.Metadata.ResourceVersion
	w.setWorkers()
	return nil
}

// podWithID returns the key and record of a routed Pod advertising id.
func (w *KubeWatcher) podWithID(id string) (string, fleet.Record, bool) {
	for k, r := range w.byPod {
		if r.ID == id {
			return k, r, true
		}
	}
	return "", fleet.Record{}, false
}

// heldByAnother reports whether a routed Pod other than key holds id:
// the sink holds its record for id.
func (w *KubeWatcher) heldByAnother(id, key string) bool {
	k, ok := w.owner[id]
	if !ok || k == key {
		return false
	}
	r, routed := w.byPod[k]
	return routed && r.ID == id
}

// setOwner records that the sink holds key's record for id.
func (w *KubeWatcher) setOwner(id, key string) {
	if w.owner == nil {
		w.owner = map[string]string{}
	}
	w.owner[id] = key
}

// setWorkers counts the worker ids of the routed Pods: two Pods of one id
// are one worker, and a record the sink leaves out is counted apart.
func (w *KubeWatcher) setWorkers() {
	ids := make(map[string]bool, len(w.byPod))
	for _, r := range w.byPod {
		ids[r.ID] = true
	}
	w.workers.set(w.sink, ids, w.st)
}

// watch streams events from w.rv until the server ends the watch (nil),
// the resource version expires (errGone) or the stream fails.
func (w *KubeWatcher) watch(ctx context.Context) error {
	q := url.Values{}
	q.Set("watch", "1")
	q.Set("resourceVersion", w.rv)
	q.Set("allowWatchBookmarks", "true")
	timeout := watchTimeout(w.cfg.WatchTimeout)
	q.Set("timeoutSeconds", fmt.Sprint(int(timeout/time.Second)))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The API server ends the watch after timeoutSeconds, whether events
	// came or not; one still open well past it has stopped answering
	// with the connection up (a hung or partitioned server whose TCP
	// keepalive probes are still answered, by it or by a proxy), and is
	// cut. A quiet watch is not cut earlier: bookmarks are sent at the
	// server's discretion, not at any interval, and never by one with
	// its watch cache off, whose quiet watches were cut every 90 s and
	// reported as an unreachable API. A dead peer is noticed sooner by
	// the connection's TCP keepalive (kubeconfig.go).
	bound := watchBound(timeout)
	var overdue atomic.Bool
	dog := time.AfterFunc(bound, func() { overdue.Store(true); cancel() })
	defer dog.Stop()
	overdueErr := func() error {
		return fmt.Errorf("%w: still open %s after it began, past its server-side timeout of %s: the API server stopped answering", errOverdueWatch, bound, timeout)
	}
	req, err := http.NewRequestWithContext(wctx, http.MethodGet, w.podsURL(q), nil)
	if err != nil {
		return fmt.Errorf("cannot build watch request: %w", err)
	}
	// Timed from the request, as client-go's reflector does: a proxy
	// may hold the headers of a quiet watch until the server ends it.
	began := time.Now()
	w.servedAt = time.Time{}
	resp, err := w.c.do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err() // closed
		}
		if overdue.Load() {
			return overdueErr()
		}
		w.setHealth(false, err)
		if errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("%w: cannot watch pods: %w", errWatchRefused, err)
		}
		return fmt.Errorf("cannot watch pods: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests {
		return fmt.Errorf("%w: %w", errWatchThrottled, apiError(resp))
	}
	if resp.StatusCode == http.StatusForbidden {
		return fmt.Errorf("%w: %w", errWatchForbidden, apiError(resp))
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("cannot watch pods: %w", apiError(resp))
	}
	w.setDenied(nil)
	w.setHealth(true, nil)
	w.servedAt = time.Now()
	dec := json.NewDecoder(bufio.NewReaderSize(resp.Body, 64<<10))
	for events := 0; ; events++ {
		var ev kubeEvent
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() == nil && overdue.Load() {
				return overdueErr()
			}
			if !streamCut(err) {
				return fmt.Errorf("watch stream: %w", err) // relisted
			}
			// The server's end of the stream, or a stream cut mid-way
			// (the API server restarting, a proxy closing it, a reset,
			// a TCP keepalive timeout), with the events read so far
			// applied: it is resumed from rv, as client-go's stream
			// watcher takes a probable EOF or a timeout for the
			// watch's end.
			if events == 0 && time.Since(began) < shortWatch {
				return errShortWatch
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("%w: %w", errStreamCut, err)
		}
		if err := w.apply(&ev); err != nil {
			return err
		}
	}
}

func (w *KubeWatcher) apply(ev *kubeEvent) error {
	switch ev.Type {
	case "ERROR":
		var st kubeStatus
		if err := json.Unmarshal(ev.Object, &st); err != nil {
			return fmt.Errorf("watch error event: %w", err)
		}
		switch {
		case st.Code == http.StatusGone:
			return fmt.Errorf("%w: %s", errGone, st.Message)
		case st.Code == http.StatusTooManyRequests || st.Reason == "TooManyRequests" ||
			st.Reason == "ServerTimeout" || st.Reason == "InternalError" ||
			st.Code == http.StatusInternalServerError || st.Code == http.StatusGatewayTimeout:
			// An API server shedding load or timing out ends the watch
			// with one of these: the resource version is still good.
			return fmt.Errorf("%w: watch error event %d %s: %s", errWatchThrottled, st.Code, st.Reason, st.Message)
		}
		return fmt.Errorf("watch error %d %s: %s", st.Code, st.Reason, st.Message)
	case "ADDED", "MODIFIED", "DELETED", "BOOKMARK":
	default:
		w.st.log.Warn("kubernetes discovery: ignoring unknown watch event", "type", ev.Type)
		return nil
	}
	var p kubePod
	if err := json.Unmarshal(ev.Object, &p); err != nil {
		w.st.badRecord("watch event", fmt.Errorf("cannot decode pod: %w", err))
		return nil
	}
	if p.Metadata.ResourceVersion != "" {
		w.rv = p.Metadata.ResourceVersion
	}
	if ev.Type == "BOOKMARK" {
		return nil
	}
	key := p.key()
	old, had := w.byPod[key]
	var rec fleet.Record
	routable := false
	if ev.Type != "DELETED" {
		var bad error
		rec, routable, bad = w.record(&p)
		if bad != nil {
			w.st.badRecord(key, bad)
		}
	}
	if had && (!routable || rec.ID != old.ID) {
		delete(w.byPod, key)
		// Another routable Pod may advertise the same id (a rollout with a
		// fixed --id): it keeps the worker, so hand it back to the sink.
		if k, other, ok := w.podWithID(old.ID); ok {
			if err := w.sink.Upsert(other); err != nil {
				w.st.badRecord(key, err)
				delete(w.owner, old.ID)
			} else {
				w.setOwner(old.ID, k)
			}
		} else {
			w.sink.Remove(old.ID)
			delete(w.owner, old.ID)
		}
	}
	if routable && w.heldByAnother(rec.ID, key) {
		// Another routed Pod holds the id: it keeps the worker until
		// it goes away, and this Pod stands by (its record kept, handed
		// over then). Any change to this Pod, or a new Pod of the id,
		// took the worker over, made anew each time.
		w.byPod[key] = rec
	} else if routable {
		if err := w.sink.Upsert(rec); err != nil {
			w.st.badRecord(key, err)
		} else {
			w.byPod[key] = rec
			w.setOwner(rec.ID, key)
		}
	}
	w.setWorkers()
	return nil
}
