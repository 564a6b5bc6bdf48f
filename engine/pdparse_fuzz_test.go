package engine

import (
	"math"
	"strings"
	"testing"
)

// FuzzParsePD: arbitrary bodies never panic; accepted fields are in range,
// and errors are client errors.
func FuzzParsePD(f *testing.F) {
	for _, s := range []string{
		`{"bootstrap_host":"10.0.0.1","bootstrap_port":8998,"bootstrap_room":9223372036854775807}`,
		`{"bootstrap_host":["[::1]"],"bootstrap_port":[null],"bootstrap_room":[0]}`,
		`{"bootstrap_room":1,"bootstrap_room":-1}`,
		`{"bootstrap_port":null,"bootstrap_room":12}`,
		`{"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`,
		`{"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2,3]],"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":5600,"tp_size":1}}`,
		`{"kv_transfer_params":{"remote_block_ids":[4,5]}}`,
		`{"kv_transfer_params":{"remote_block_ids":[[1],[2]]}}`,
		`{"kv_transfer_params":null}`, `{"kv_transfer_params":[]}`,
		`{`, `null`, `[]`, `{"bootstrap_room":1e3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, mode := range []PDMode{PDSGLang, PDVLLM} {
			p, err := parsePDFields(body, mode)
			if err != nil {
				if _, ok := err.(*badRequestError); !ok {
					t.Fatalf("%s: non-client error %T %v", mode, err, err)
				}
				continue
			}
			if p.hasRoom && p.room < 0 || p.hasHost && !validHost(p.host) || p.port < 0 || p.port > math.MaxUint16 {
				t.Fatalf("%s: accepted out-of-range fields %+v", mode, p)
			}
			if kv := p.kv; kv != nil {
				if kv.port < 0 || kv.port > math.MaxUint16 || kv.hasBlockIDs && kv.blockIDs == nil || kv.host != "" && !validHost(kv.host) {
					t.Fatalf("accepted out-of-range kv_transfer_params %+v", kv)
				}
				for _, id := range kv.blockIDs {
					if id < 0 || id > math.MaxInt32 {
						t.Fatalf("accepted block id %d", id)
					}
				}
			}
		}
	})
}

func TestParsePDFields(t *testing.T) {
	f := func(body string, mode PDMode, want pdFields) {
		t.Helper()
		got, err := parsePDFields([]byte(body), mode)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		got.kv, want.kv = nil, nil
		if got != want {
			t.Fatalf("%s: got %+v, want %+v", body, got, want)
		}
	}
	f(`{"bootstrap_host":"h","bootstrap_port":7,"bootstrap_room":3}`, PDSGLang,
		pdFields{host: "h", port: 7, room: 3, hasHost: true, hasPort: true, hasRoom: true})
	// Batch forms of one element, a null port (the engine's own), duplicates
	// (the last wins, as in Python) and keys that differ in case (not ours).
	f(`{"bootstrap_host":["h"],"bootstrap_port":[null],"bootstrap_room":[4],"bootstrap_room":5,"Bootstrap_Room":6}`, PDSGLang,
		pdFields{host: "h", room: 5, hasHost: true, hasPort: true, hasRoom: true})
	f(`{"bootstrap_room":null}`, PDSGLang, pdFields{})
	f(`{"bootstrap_room":9223372036854775807}`, PDSGLang, pdFields{room: math.MaxInt64, hasRoom: true})
	if _, err := parsePDFields([]byte(`{"bootstrap_room":9223372036854775808}`), PDSGLang); err == nil {
		t.Fatal("room 2^63 accepted")
	}
	p, err := parsePDFields([]byte(`{"kv_transfer_params":{"remote_block_ids":[3,4],"remote_port":1,"do_remote_prefill":true}}`), PDVLLM)
	if err != nil || p.kv == nil || !p.kv.doRemotePrefill || p.kv.port != 1 || len(p.kv.blockIDs) != 2 || p.kv.blockIDs[1] != 4 {
		t.Fatalf("flat block ids: %+v %v", p.kv, err)
	}
	for _, h := range []string{"10.0.0.1", "[::1]", "::1", "prefill-0.svc.cluster.local"} {
		if !validHost(h) {
			t.Fatalf("host %q refused", h)
		}
	}
	for _, h := range []string{"", "a b", "x/y", "h\n", "[not-ip]", strings.Repeat("a", 254)} {
		if validHost(h) {
			t.Fatalf("host %q accepted", h)
		}
	}
	p, err = parsePDFields([]byte(`{"kv_transfer_params":{"remote_block_ids":[[]]}}`), PDVLLM)
	if err != nil || !p.kv.hasBlockIDs || p.kv.blockIDs == nil || len(p.kv.blockIDs) != 0 {
		t.Fatalf("empty group: %+v %v", p.kv, err)
	}
}
