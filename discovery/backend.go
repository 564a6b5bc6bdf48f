package discovery

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Backend is a running discovery backend, as the server holds it.
type Backend interface {
	// Start runs the list/watch loop in the background.
	Start()
	// WaitSynced waits for the first successful list.
	WaitSynced(ctx context.Context) error
	// Health reports backend connectivity for /health; when not ok the
	// fleet is the last known list, or (Kubernetes, watch forbidden) one
	// refreshed by relists alone.
	Health() (ok bool, detail string)
	// Close stops the backend.
	Close()
}

var (
	_ Backend = (*EtcdWatcher)(nil)
	_ Backend = (*KubeWatcher)(nil)
)

// Options are the server flags that select and configure a backend.
type Options struct {
	// Backend is etcd or kubernetes (--discovery-backend).
	Backend string
	// Etcd: endpoints (--etcd-endpoint, comma-separated), prefix, TLS and
	// auth (--etcd-ca-file, --etcd-cert-file, --etcd-key-file,
	// --etcd-username, --etcd-password).
	EtcdEndpoints                         []string
	EtcdPrefix                            string
	EtcdCAFile, EtcdCertFile, EtcdKeyFile string
	EtcdUsername, EtcdPassword            string
	// Kubernetes: --kubeconfig (empty: in-cluster), --k8s-namespace (empty:
	// the service account's / kubeconfig context's namespace, "default"
	// when the context names none; "*" or "all": every namespace), --k8s-label-selector, --k8s-annotation.
	Kubeconfig       string
	K8sNamespace     string
	K8sLabelSelector string
	K8sAnnotation    string
}

// New builds the backend feeding sink; call Start (and usually WaitSynced
// with a timeout) next.
func New(o Options, sink Sink) (Backend, error) {
	switch o.Backend {
	case BackendEtcd:
		var eps []string
		for _, e := range o.EtcdEndpoints {
			for _, p := range strings.Split(e, ",") {
				if p = strings.TrimSpace(p); p != "" {
					eps = append(eps, p)
				}
			}
		}
		return NewEtcdWatcher(EtcdConfig{
			Endpoints: eps, Prefix: o.EtcdPrefix,
			CAFile: o.EtcdCAFile, CertFile: o.EtcdCertFile, KeyFile: o.EtcdKeyFile,
			Username: o.EtcdUsername, Password: o.EtcdPassword,
		}, nil, sink)
	case BackendKubernetes:
		var kc *KubeConfig
		var err error
		if o.Kubeconfig != "" {
			kc, err = LoadKubeconfig(o.Kubeconfig)
		} else {
			kc, err = InClusterConfig()
		}
		if err != nil {
			return nil, err
		}
		ns := o.K8sNamespace
		switch ns {
		case "":
			// A context naming no namespace means "default", as kubectl
			// reads it (not every namespace).
			ns = kc.NamespaceOrDefault()
		case "*", "all":
			ns = ""
		}
		return NewKubeWatcher(kc, KubeWatcherConfig{Namespace: ns, LabelSelector: o.K8sLabelSelector, Annotation: o.K8sAnnotation}, sink)
	default:
		return nil, fmt.Errorf("discovery backend %q: want etcd or kubernetes", o.Backend)
	}
}

// StartSynced is New + Start + WaitSynced(timeout). On a sync timeout the
// backend keeps running (it retries) and is returned with the error, so a
// server may start with an empty fleet and say so in /health.
func StartSynced(o Options, sink Sink, timeout time.Duration) (Backend, error) {
	b, err := New(o, sink)
	if err != nil {
		return nil, err
	}
	b.Start()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return b, b.WaitSynced(ctx)
}
