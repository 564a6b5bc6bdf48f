package admin

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

// A user's largest valid settings fit the user endpoints' body limit: 256
// model patterns of 256 bytes (config.MaxUserModels and
// MaxUserModelPattern) are a 66 KB body, which the 64 KiB limit refused
// with 413 although the config takes them.
func TestTheLargestValidUserFitsTheUserEndpoints(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	models := make([]string, config.MaxUserModels)
	for i := range models {
		p := strings.Repeat("m", config.MaxUserModelPattern-4) + "-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + "*"
		models[i] = p[:config.MaxUserModelPattern]
	}
	body, _ := json.Marshal(map[string]any{"name": "alice", "models": models})
	if r := e.do("POST", "/api/users", string(body)); r.status != 201 {
		t.Fatalf("create with %d bytes: %d %.300s", len(body), r.status, r.body)
	}
	body, _ = json.Marshal(map[string]any{"enabled": false, "models": models})
	if r := e.do("PUT", "/api/users/alice", string(body), "If-Match", e.etag()); r.status != 200 {
		t.Fatalf("update with %d bytes: %d %.300s", len(body), r.status, r.body)
	}
	if u := e.store.Load().Users[0]; len(u.Models) != config.MaxUserModels || u.Enabled {
		t.Fatalf("stored %d models, enabled %v", len(u.Models), u.Enabled)
	}
	// Past the largest valid user, the limit still answers 413.
	if r := e.do("POST", "/api/users", `{"name":"bob","models":["`+strings.Repeat("x", 2<<20)+`"]}`); r.status != 413 {
		t.Fatalf("a 2 MiB user body: %d %.300s", r.status, r.body)
	}
}
