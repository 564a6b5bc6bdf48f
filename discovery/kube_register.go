package discovery

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/infera/infera/fleet"
)

// KubeRegistrar writes one worker's record into the annotation of its own
// Pod (POD_NAMESPACE/POD_NAME from the downward API). No heartbeat: the
// Pod's lifecycle and readiness say whether the worker lives.
type KubeRegistrar struct {
	c          *kubeClient
	namespace  string
	pod        string
	annotation string
	timeout    time.Duration
}

// NewKubeRegistrar returns a registrar patching namespace/pod.
func NewKubeRegistrar(kc *KubeConfig, namespace, pod, annotation string) (*KubeRegistrar, error) {
	if namespace == "" || pod == "" {
		return nil, fmt.Errorf("kubernetes registrar: pod namespace and name are required (set POD_NAMESPACE and POD_NAME from the downward API)")
	}
	c, err := newKubeClient(kc)
	if err != nil {
		return nil, err
	}
	if annotation == "" {
		annotation = DefaultAnnotation
	}
	return &KubeRegistrar{c: c, namespace: namespace, pod: pod, annotation: annotation, timeout: 10 * time.Second}, nil
}

// Register writes rec into the Pod annotation.
func (r *KubeRegistrar) Register(ctx context.Context, rec fleet.Record) error {
	if err := rec.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("cannot encode worker record: %w", err)
	}
	s := string(b)
	return r.patch(ctx, &s)
}

// Update rewrites the record (e.g. Status DRAINING).
func (r *KubeRegistrar) Update(ctx context.Context, rec fleet.Record) error {
	return r.Register(ctx, rec)
}

// Deregister removes the annotation.
func (r *KubeRegistrar) Deregister(ctx context.Context) error { return r.patch(ctx, nil) }

func (r *KubeRegistrar) patch(ctx context.Context, val *string) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{r.annotation: val}}})
	if err != nil {
		return fmt.Errorf("cannot encode patch: %w", err)
	}
	u := r.c.base + "/api/v1/namespaces/" + url.PathEscape(r.namespace) + "/pods/" + url.PathEscape(r.pod)
	tctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	// A merge patch of one annotation is idempotent: one that failed for
	// a passing reason (the API server restarting or overloaded, a token
	// rotated: 401 reads the file again) is sent again within the timeout.
	// Once was all: the DRAINING mark or the deregistration was lost, and
	// the router kept routing to the draining worker, or to a worker
	// whose engine is gone.
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		retry, err := r.patchOnce(tctx, u, body)
		if err == nil || !retry {
			return err
		}
		select {
		case <-tctx.Done():
			return err
		case <-time.After(delay):
		}
	}
}

// patchOnce sends one patch; retry says whether its failure may pass.
func (r *KubeRegistrar) patchOnce(ctx context.Context, u string, body []byte) (retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, u, bytes.NewReader(body))
	if err != nil {
		return false, fmt.Errorf("cannot build patch request: %w", err)
	}
	req.Header.Set("Content-Type", "application/merge-patch+json")
	resp, err := r.c.do(req)
	if err != nil {
		return true, fmt.Errorf("cannot patch pod %s/%s: %w", r.namespace, r.pod, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		retry = resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode/100 == 5
		return retry, fmt.Errorf("cannot patch pod %s/%s: %w", r.namespace, r.pod, apiError(resp))
	}
	return false, nil
}
