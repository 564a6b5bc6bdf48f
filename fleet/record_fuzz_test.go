package fleet

import (
	"encoding/json"
	"net/url"
	"reflect"
	"testing"
)

// A worker record comes from whoever can write to etcd or annotate a Pod:
// ParseRecord never panics, what it accepts is valid and survives being
// published again (json.Marshal, then ParseRecord), and its PD bootstrap
// data reads to a port in range.
func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{
		"", "null", "{}", "[]", `{"id":"a"}`,
		`{"id":"w0","url":"http://127.0.0.1:8101","models":["Qwen/Qwen3-8B"],"kv_events_endpoint":"tcp://127.0.0.1:5557","block_size":16}`,
		`{"id":"p0","url":"http://[::1]:30000","models":["m"],"role":"prefill","bootstrap":{"pd_mode":"sglang","bootstrap_host":"::1","bootstrap_port":8998}}`,
		`{"id":"p1","url":"http://10.0.0.5:8000","models":["m"],"role":"prefill","bootstrap":{"pd_mode":"VLLM","bootstrap_port":"8998"}}`,
		`{"id":"d0","url":"http://h:1","models":["m"],"role":"decode","status":"DRAINING","dp_size":4,"request_transport":"nats"}`,
		`{"id":"x","url":"http://h:1","bootstrap":{"bootstrap_port":1e300,"bootstrap_host":7}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseRecord(data)
		if err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("accepted an invalid record: %v", err)
		}
		u, _ := url.Parse(r.URL)
		p := parsePD(&r, u.Hostname())
		if p.BootstrapPort < 0 || p.BootstrapPort > 65535 {
			t.Fatalf("bootstrap port %d", p.BootstrapPort)
		}
		out, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("accepted record does not encode: %v", err)
		}
		r2, err := ParseRecord(out)
		if err != nil {
			t.Fatalf("re-published record refused: %v\n%s", err, out)
		}
		// The opaque bootstrap data may be re-indented: compare the rest.
		r.Bootstrap, r2.Bootstrap = nil, nil
		if !reflect.DeepEqual(r, r2) {
			t.Fatalf("record changed on the way round:\n%+v\n%+v", r, r2)
		}
	})
}
