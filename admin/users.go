package admin

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/infera/infera/config"
	"github.com/infera/infera/govern"
)

// Users and quota templates live in the config (users, and
// user_limit.templates); these endpoints are conveniences over the same
// versioned document, validated by the same rules, with one thing the
// section endpoints cannot do: mint an API key, whose clear form is
// answered once and never stored (only its salted hash is).

// UserView is a user as the API shows it: keys by id only.
type UserView struct {
	Name     string `json:"name"`
	Template string `json:"template"`
	Enabled  bool   `json:"enabled"`
	// Models the user may call (names or '*' patterns); empty: all.
	Models []string `json:"models"`
	KeyIDs []string `json:"key_ids"`
}

func (a *Admin) userRoutes(api func(string, func(http.ResponseWriter, *http.Request) error)) {
	api("GET /api/users", a.listUsers)
	api("POST /api/users", a.createUser)
	api("GET /api/users/{name}", a.getUser)
	api("PUT /api/users/{name}", a.putUser)
	api("DELETE /api/users/{name}", a.deleteUser)
	api("GET /api/users/{name}/usage", a.getUserUsage)
	api("POST /api/users/{name}/keys", a.addKey)
	api("DELETE /api/users/{name}/keys/{id}", a.deleteKey)
	api("GET /api/templates", a.listTemplates)
	api("POST /api/templates", a.createTemplate)
	api("GET /api/templates/{name}", a.getTemplate)
	api("PUT /api/templates/{name}", a.putTemplate)
	api("DELETE /api/templates/{name}", a.deleteTemplate)
}

func viewOf(u config.User) UserView {
	v := UserView{Name: u.Name, Template: u.Template, Enabled: u.Enabled, Models: u.Models, KeyIDs: []string{}}
	if v.Models == nil {
		v.Models = []string{}
	}
	for _, k := range u.Keys {
		if h, err := config.ParseKeyHash(k); err == nil {
			v.KeyIDs = append(v.KeyIDs, h.ID)
		}
	}
	return v
}

func (a *Admin) listUsers(w http.ResponseWriter, r *http.Request) error {
	c, v := a.store.Current()
	out := make([]UserView, 0, len(c.Users))
	for _, u := range c.Users {
		out = append(out, viewOf(u))
	}
	a.setVersionHeaders(w, c, v)
	writeJSON(w, http.StatusOK, map[string]any{"users": out})
	return nil
}

func findUser(c *config.Config, name string) (config.User, bool) {
	for _, u := range c.Users {
		if u.Name == name {
			return u, true
		}
	}
	return config.User{}, false
}

func (a *Admin) getUser(w http.ResponseWriter, r *http.Request) error {
	c, v := a.store.Current()
	u, ok := findUser(c, r.PathValue("name"))
	if !ok {
		return &httpError{status: http.StatusNotFound, msg: "no such user"}
	}
	a.setVersionHeaders(w, c, v)
	writeJSON(w, http.StatusOK, viewOf(u))
	return nil
}

// getUserUsage answers where a user stands against its template's limits
// (the router's governance; with Redis the shared counters).
func (a *Admin) getUserUsage(w http.ResponseWriter, r *http.Request) error {
	c, _ := a.store.Current()
	name := r.PathValue("name")
	if _, ok := findUser(c, name); !ok {
		return &httpError{status: http.StatusNotFound, msg: "no such user"}
	}
	src, ok := a.fleetView().(UsageSource)
	if !ok {
		return &httpError{status: http.StatusServiceUnavailable, msg: "usage is not available: the router's governance is not running"}
	}
	st, err := src.UserUsage(name)
	switch {
	case errors.Is(err, govern.ErrNoUser):
		// Configured but not applied yet (a change in flight): not known.
		return &httpError{status: http.StatusNotFound, msg: "no such user in the router's current governance"}
	case err != nil:
		slog.Warn("user usage not read", "user", name, "err", err)
		return &httpError{status: http.StatusServiceUnavailable, msg: "the rate limiting state store is unavailable"}
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// keysCapErr refuses a write that would leave a user of next with more
// keys than config.MaxAPIUserKeys, unless the user held at least as many
// in cur (data from before the cap keeps loading, and may be written back
// as it is or with fewer keys, but not grow). The error names the user and
// the count, never a key.
func keysCapErr(cur, next *config.Config) error {
	var held map[string]int
	for i := range next.Users {
		u := &next.Users[i]
		if len(u.Keys) <= config.MaxAPIUserKeys {
			continue
		}
		if held == nil {
			held = make(map[string]int)
			for j := range cur.Users {
				if n := len(cur.Users[j].Keys); n > config.MaxAPIUserKeys {
					held[cur.Users[j].Name] = n
				}
			}
		}
		had := held[u.Name]
		if len(u.Keys) <= had {
			continue
		}
		msg := fmt.Sprintf("user %q would hold %d API keys: at most %d per user (revoke keys, or give them to another user)", u.Name, len(u.Keys), config.MaxAPIUserKeys)
		if had > 0 {
			msg = fmt.Sprintf("user %q would hold %d API keys: it holds %d, more than the %d a user may hold, and a write may keep or lower that but not grow it", u.Name, len(u.Keys), had, config.MaxAPIUserKeys)
		}
		return &config.FieldError{Path: fmt.Sprintf("users[%d].keys", i), Msg: msg}
	}
	return nil
}

func stringsAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// userInput is the body of POST /api/users and PUT /api/users/{name}.
type userInput struct {
	Name string `json:"name"`
	// Template: absent keeps the user's on PUT ("" clears it).
	Template *string `json:"template"`
	Enabled  *bool   `json:"enabled"`
	// Models: absent keeps the user's list on PUT ([] allows every model).
	Models *[]string `json:"models"`
}

// maxUserBodyBytes bounds the body of POST /api/users and PUT
// /api/users/{name}: above the largest valid user, whose config.MaxUserModels
// patterns of config.MaxUserModelPattern bytes may each be written with
// \u escapes (6 bytes a byte: 393 KB). 64 KiB refused a valid user of 256
// patterns of 256 bytes (66 KB) with 413.
const maxUserBodyBytes = 1 << 20

func readUserInput(w http.ResponseWriter, r *http.Request) (userInput, error) {
	var in userInput
	body, err := readBody(w, r, maxUserBodyBytes)
	if err != nil {
		return in, err
	}
	if err := decodeStrictInto(body, &in); err != nil {
		return in, err
	}
	if err := config.RepeatedKey(body, ""); err != nil { // decoding kept the last copy
		return in, err
	}
	return in, nil
}

// userErr points a validation error of users[i], the user a POST
// /api/users or PUT /api/users/{name} wrote, at the body's field (name,
// template, models[1]): the config's path named a position in the users
// list that the client never sent. An error elsewhere (another user, a
// hand edit) keeps its path.
func userErr(err error, i int) error {
	fe, ok := err.(*config.FieldError)
	if !ok || i < 0 {
		return err
	}
	rest, ok := strings.CutPrefix(fe.Path, fmt.Sprintf("users[%d]", i))
	if !ok || rest != "" && rest[0] != '.' && rest[0] != '[' {
		return err // users[1] is not users[10]
	}
	return &config.FieldError{Path: strings.TrimPrefix(rest, "."), Msg: fe.Msg}
}

// users returns the users list of a working document.
func users(doc map[string]any) []any {
	l, _ := doc["users"].([]any)
	return l
}

// userIndex finds a user in a working document.
func userIndex(doc map[string]any, name string) int {
	for i, u := range users(doc) {
		if m, ok := u.(map[string]any); ok && m["name"] == name {
			return i
		}
	}
	return -1
}

func (a *Admin) createUser(w http.ResponseWriter, r *http.Request) error {
	base, err := a.ifMatch(r, false)
	if err != nil {
		return err
	}
	in, err := readUserInput(w, r)
	if err != nil {
		return err
	}
	key, hash, err := govern.NewKey()
	if err != nil {
		return err
	}
	enabled := in.Enabled == nil || *in.Enabled
	idx := -1
	c, v, err := a.change(a.who(r), "create user "+in.Name, base, func(doc map[string]any) error {
		if in.Name != "" && userIndex(doc, in.Name) >= 0 {
			return &httpError{status: http.StatusConflict, msg: fmt.Sprintf("user %q exists", in.Name)}
		}
		if n := len(users(doc)); n >= config.MaxAPIUsers {
			return &httpError{status: http.StatusConflict, msg: fmt.Sprintf("there are %d users, the most POST /api/users creates (%d): delete users (DELETE /api/users/{name}) before creating another", n, config.MaxAPIUsers)}
		}
		u := map[string]any{"name": in.Name, "template": "", "enabled": enabled, "keys": []any{hash}}
		if in.Template != nil {
			u["template"] = *in.Template
		}
		if in.Models != nil && len(*in.Models) > 0 {
			u["models"] = stringsAny(*in.Models)
		}
		idx = len(users(doc))
		doc["users"] = append(users(doc), u)
		return nil
	})
	if err != nil {
		return userErr(err, idx)
	}
	u, _ := findUser(c, in.Name)
	a.setVersionHeaders(w, c, v)
	writeJSON(w, http.StatusCreated, map[string]any{
		"user": viewOf(u),
		"key":  key,
		"note": "the key is shown this once: only its salted hash is stored",
	})
	return nil
}

func (a *Admin) putUser(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	base, err := a.ifMatch(r, true)
	if err != nil {
		return err
	}
	in, err := readUserInput(w, r)
	if err != nil {
		return err
	}
	if in.Name != "" && in.Name != name {
		return &config.FieldError{Path: "name", Msg: "renaming a user is not supported: create the new user and delete the old one"}
	}
	idx := -1
	c, v, err := a.change(a.who(r), "update user "+name, base, func(doc map[string]any) error {
		idx = userIndex(doc, name)
		if idx < 0 {
			return &httpError{status: http.StatusNotFound, msg: "no such user"}
		}
		m := users(doc)[idx].(map[string]any)
		if in.Template != nil {
			m["template"] = *in.Template
		}
		if in.Enabled != nil {
			m["enabled"] = *in.Enabled
		}
		switch {
		case in.Models == nil:
		case len(*in.Models) == 0:
			delete(m, "models")
		default:
			m["models"] = stringsAny(*in.Models)
		}
		return nil
	})
	if err != nil {
		return userErr(err, idx)
	}
	u, _ := findUser(c, name)
	a.setVersionHeaders(w, c, v)
	writeJSON(w, http.StatusOK, viewOf(u))
	return nil
}

func (a *Admin) deleteUser(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	base, err := a.ifMatch(r, true)
	if err != nil {
		return err
	}
	c, v, err := a.change(a.who(r), "delete user "+name, base, func(doc map[string]any) error {
		i := userIndex(doc, name)
		if i < 0 {
			return &httpError{status: http.StatusNotFound, msg: "no such user"}
		}
		l := users(doc)
		doc["users"] = append(l[:i:i], l[i+1:]...)
		return nil
	})
	if err != nil {
		return err
	}
	a.setVersionHeaders(w, c, v)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// readAddKeyBody checks that the body of POST /api/users/{name}/keys is
// empty or {}: a key has no label or expiry here, so a client that sends
// {"name":"ci","expires_at":...} is told, not left believing it set them.
func readAddKeyBody(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, 64<<10)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	doc, err := decodeDoc(body)
	if err != nil {
		return err
	}
	if len(doc) == 0 {
		return nil
	}
	fields := make([]string, 0, len(doc))
	for k := range doc {
		fields = append(fields, quoteName(k)) // the caller's text, told back bounded
	}
	sort.Strings(fields)
	first, _ := strconv.Unquote(fields[0])
	if len(fields) > 8 {
		fields = append(fields[:8], fmt.Sprintf("and %d more", len(fields)-8))
	}
	return &config.FieldError{Path: first, Msg: "unknown field(s) " + strings.Join(fields, ", ") +
		": a new key takes no settings (no name, no expiry; keys are told apart by their id): send no body, then revoke the key by its id when it is no longer needed"}
}

func (a *Admin) addKey(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	base, err := a.ifMatch(r, false)
	if err != nil {
		return err
	}
	if err := readAddKeyBody(w, r); err != nil {
		return err
	}
	key, hash, err := govern.NewKey()
	if err != nil {
		return err
	}
	c, v, err := a.change(a.who(r), "add key for user "+name, base, func(doc map[string]any) error {
		i := userIndex(doc, name)
		if i < 0 {
			return &httpError{status: http.StatusNotFound, msg: "no such user"}
		}
		m := users(doc)[i].(map[string]any)
		keys, _ := m["keys"].([]any)
		if len(keys) >= config.MaxAPIUserKeys {
			return &httpError{status: http.StatusConflict, msg: fmt.Sprintf("user %q has %d keys, the most the API mints for one user (%d): revoke one (DELETE /api/users/{name}/keys/{id}) before adding another", name, len(keys), config.MaxAPIUserKeys)}
		}
		m["keys"] = append(keys, hash)
		return nil
	})
	if err != nil {
		return err
	}
	u, _ := findUser(c, name)
	a.setVersionHeaders(w, c, v)
	writeJSON(w, http.StatusCreated, map[string]any{
		"user": viewOf(u),
		"key":  key,
		"note": "the key is shown this once: only its salted hash is stored",
	})
	return nil
}

func (a *Admin) deleteKey(w http.ResponseWriter, r *http.Request) error {
	name, id := r.PathValue("name"), r.PathValue("id")
	base, err := a.ifMatch(r, true)
	if err != nil {
		return err
	}
	c, v, err := a.change(a.who(r), "revoke key "+id+" of user "+name, base, func(doc map[string]any) error {
		i := userIndex(doc, name)
		if i < 0 {
			return &httpError{status: http.StatusNotFound, msg: "no such user"}
		}
		m := users(doc)[i].(map[string]any)
		keys, _ := m["keys"].([]any)
		out := keys[:0:0]
		for _, k := range keys {
			s, _ := k.(string)
			if h, err := config.ParseKeyHash(s); err == nil && h.ID == id {
				continue
			}
			out = append(out, k)
		}
		if len(out) == len(keys) {
			return &httpError{status: http.StatusNotFound, msg: "the user has no key with that id"}
		}
		m["keys"] = out
		return nil
	})
	if err != nil {
		return err
	}
	u, _ := findUser(c, name)
	a.setVersionHeaders(w, c, v)
	writeJSON(w, http.StatusOK, viewOf(u))
	return nil
}

// templates returns user_limit.templates of a working document.
func templates(doc map[string]any) (map[string]any, []any) {
	ul, _ := doc["user_limit"].(map[string]any)
	if ul == nil {
		ul = map[string]any{}
		doc["user_limit"] = ul
	}
	l, _ := ul["templates"].([]any)
	return ul, l
}

func templateIndex(l []any, name string) int {
	for i, t := range l {
		if m, ok := t.(map[string]any); ok && m["name"] == name {
			return i
		}
	}
	return -1
}

func (a *Admin) listTemplates(w http.ResponseWriter, r *http.Request) error {
	c, v := a.store.Current()
	ts := c.UserLimit.Templates
	if ts == nil {
		ts = []config.QuotaTemplate{}
	}
	a.setVersionHeaders(w, c, v)
	writeJSON(w, http.StatusOK, map[string]any{"templates": ts})
	return nil
}

func findTemplate(c *config.Config, name string) (config.QuotaTemplate, bool) {
	for _, t := range c.UserLimit.Templates {
		if t.Name == name {
			return t, true
		}
	}
	return config.QuotaTemplate{}, false
}

func (a *Admin) getTemplate(w http.ResponseWriter, r *http.Request) error {
	c, v := a.store.Current()
	t, ok := findTemplate(c, r.PathValue("name"))
	if !ok {
		return &httpError{status: http.StatusNotFound, msg: "no such quota template"}
	}
	a.setVersionHeaders(w, c, v)
	writeJSON(w, http.StatusOK, t)
	return nil
}

func readTemplate(w http.ResponseWriter, r *http.Request) (map[string]any, error) {
	body, err := readBody(w, r, 1<<20)
	if err != nil {
		return nil, err
	}
	doc, err := decodeDoc(body)
	if err != nil {
		return nil, err
	}
	if err := config.RepeatedKey(body, ""); err != nil { // the map kept one copy
		return nil, err
	}
	// Settings match in any case (as the config reads them): the name is
	// looked up by its own spelling here, so "Name" is taken as "name".
	for k, v := range doc {
		if k != "name" && strings.EqualFold(k, "name") {
			delete(doc, k)
			doc["name"] = v
		}
	}
	return doc, nil
}

// templateErr points a validation error of templates[i] at the body.
func templateErr(err error, i int) error {
	if fe, ok := err.(*config.FieldError); ok {
		p := fmt.Sprintf("user_limit.templates[%d]", i)
		if rest, ok := strings.CutPrefix(fe.Path, p); ok {
			return &config.FieldError{Path: strings.TrimPrefix(rest, "."), Msg: fe.Msg}
		}
		// A type error's path has no list indexes (encoding/json's).
		if rest, ok := strings.CutPrefix(fe.Path, "user_limit.templates."); ok {
			return &config.FieldError{Path: rest, Msg: fe.Msg}
		}
	}
	return err
}

func (a *Admin) createTemplate(w http.ResponseWriter, r *http.Request) error {
	base, err := a.ifMatch(r, false)
	if err != nil {
		return err
	}
	in, err := readTemplate(w, r)
	if err != nil {
		return err
	}
	name, _ := in["name"].(string)
	idx := -1
	c, v, err := a.change(a.who(r), "create template "+name, base, func(doc map[string]any) error {
		ul, l := templates(doc)
		if name != "" && templateIndex(l, name) >= 0 {
			return &httpError{status: http.StatusConflict, msg: fmt.Sprintf("quota template %q exists", name)}
		}
		idx = len(l)
		ul["templates"] = append(l, in)
		return nil
	})
	if err != nil {
		return templateErr(err, idx)
	}
	t, _ := findTemplate(c, name)
	a.setVersionHeaders(w, c, v)
	writeJSON(w, http.StatusCreated, t)
	return nil
}

func (a *Admin) putTemplate(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	base, err := a.ifMatch(r, true)
	if err != nil {
		return err
	}
	in, err := readTemplate(w, r)
	if err != nil {
		return err
	}
	if n, ok := in["name"]; ok && n != name {
		return &config.FieldError{Path: "name", Msg: "renaming a template is not supported: create the new one, rebind users, delete the old one"}
	}
	in["name"] = name
	idx := -1
	c, v, err := a.change(a.who(r), "update template "+name, base, func(doc map[string]any) error {
		_, l := templates(doc)
		idx = templateIndex(l, name)
		if idx < 0 {
			return &httpError{status: http.StatusNotFound, msg: "no such quota template"}
		}
		l[idx] = in
		return nil
	})
	if err != nil {
		return templateErr(err, idx)
	}
	t, _ := findTemplate(c, name)
	a.setVersionHeaders(w, c, v)
	writeJSON(w, http.StatusOK, t)
	return nil
}

func (a *Admin) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	base, err := a.ifMatch(r, true)
	if err != nil {
		return err
	}
	c, v, err := a.change(a.who(r), "delete template "+name, base, func(doc map[string]any) error {
		ul, l := templates(doc)
		i := templateIndex(l, name)
		if i < 0 {
			return &httpError{status: http.StatusNotFound, msg: "no such quota template"}
		}
		ul["templates"] = append(l[:i:i], l[i+1:]...)
		return nil
	})
	if err != nil {
		return err
	}
	a.setVersionHeaders(w, c, v)
	w.WriteHeader(http.StatusNoContent)
	return nil
}
