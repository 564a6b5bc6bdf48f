package discovery

import (
	"fmt"
	"log/slog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

// Agrees reports whether a worker's record is reachable by a server using
// requestTransport (http|nats) and kvTransport (zmq|nats). An empty field in
// the record means "whatever the server uses". On false, reason says what
// disagrees; the proxy excludes the worker and logs reason once.
func Agrees(rec fleet.Record, requestTransport, kvTransport string) (ok bool, reason string) {
	if rec.RequestTransport != "" && requestTransport != "" && rec.RequestTransport != requestTransport {
		return false, fmt.Sprintf("worker %q serves requests over %s but the server uses --request-transport %s", rec.ID, rec.RequestTransport, requestTransport)
	}
	if rec.KVEventTransport != "" && kvTransport != "" && rec.KVEventTransport != kvTransport {
		return false, fmt.Sprintf("worker %q publishes KV events over %s but the server uses --kv-event-transport %s", rec.ID, rec.KVEventTransport, kvTransport)
	}
	if requestTransport == "nats" && !validSubjectToken(rec.ID) {
		return false, fmt.Sprintf("worker id %q cannot be a NATS subject token", rec.ID)
	}
	// A worker without a KV-event endpoint is still routable: it simply
	// contributes nothing to the KV index.
	return true, ""
}

// CheckStaticWorkers reports, as a *config.FieldError, the first worker of
// cfg's static list that a server using these transports could not reach
// (Agrees): the fleet would skip it, so a config listing one is refused
// (config.Store.SetCheck) rather than half applied.
func CheckStaticWorkers(cfg *config.Config, requestTransport, kvTransport string) error {
	for i := range cfg.Workers {
		if ok, reason := Agrees(cfg.Workers[i].Record(), requestTransport, kvTransport); !ok {
			return &config.FieldError{Path: fmt.Sprintf("workers[%d]", i), Msg: reason}
		}
	}
	return nil
}

// validSubjectToken mirrors broker.ValidWorkerID (kept here so discovery
// does not import the NATS code).
func validSubjectToken(id string) bool {
	if id == "" {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= 0x20 || c == 0x7f || c == '.' || c == '*' || c == '>' {
			return false
		}
	}
	return true
}

// AgreementHook is the fleet hook that excludes workers whose record
// advertises a transport this server does not use (they would be
// unreachable), and warns once about a KV block size that differs from the
// router's (such a worker stays routable, its cache never matches).
type AgreementHook struct {
	RequestTransport, KVTransport string
	KVAware                       bool
	BlockSize                     int
	// Under the fleet lock. warned holds the live workers whose block size
	// was warned about (dropped when they leave); rejected the ids whose
	// exclusion was logged (never added, so never removed: bounded by
	// maxRejectedLogged instead).
	warned, rejected map[string]bool
}

// maxRejectedLogged bounds AgreementHook.rejected: beyond it the set is
// cleared, so an excluded worker is logged again at worst once per that
// many other excluded ids (discovery retries excluded records on every
// sync; with pod-name ids the set of ids ever seen has no bound).
const maxRejectedLogged = 1024

var _ fleet.Hook = (*AgreementHook)(nil)

// WorkerAdded implements fleet.Hook.
func (a *AgreementHook) WorkerAdded(w *fleet.Worker) error {
	if ok, reason := Agrees(w.Record, a.RequestTransport, a.KVTransport); !ok {
		if !a.rejected[w.ID] {
			if a.rejected == nil || len(a.rejected) >= maxRejectedLogged {
				a.rejected = map[string]bool{}
			}
			a.rejected[w.ID] = true
			slog.Error("worker excluded: transports disagree with this server (match the flags fleet-wide)", "worker", w.ID, "reason", reason)
		}
		return fmt.Errorf("transport mismatch: %s", reason)
	}
	delete(a.rejected, w.ID)
	if a.KVAware && w.BlockSize > 0 && w.BlockSize != a.BlockSize && !a.warned[w.ID] {
		if a.warned == nil {
			a.warned = map[string]bool{}
		}
		a.warned[w.ID] = true
		slog.Warn("worker's KV block size differs from --kv-block-size: its cache will never match prompts",
			"worker", w.ID, "worker_block_size", w.BlockSize, "kv_block_size", a.BlockSize)
	}
	return nil
}

// WorkerRemoved implements fleet.Hook.
func (a *AgreementHook) WorkerRemoved(w *fleet.Worker) { delete(a.warned, w.ID) }
