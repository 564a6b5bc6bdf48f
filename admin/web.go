package admin

import (
	"embed"
	"io/fs"
	"net/http"
)

// The console is plain HTML, CSS and JavaScript embedded in the binary: no
// CDN, no build step.
//
//go:embed web
var webFS embed.FS

func consoleHandler() http.Handler {
	sub, err := fs.Sub(webFS, "web")
	if err != nil {
		panic("BUG: embedded console: " + err.Error())
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
