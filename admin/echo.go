package admin

import (
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// An error that names what the client sent (an unknown field, a section,
// a query parameter) repeats the name bounded and escaped, and never a
// value: a 1 MiB user body with one unknown field was answered with the
// whole field name, and an answer is not the place for what a client
// pasted (a key pasted in the wrong place included).

// maxEchoed bounds the bytes of a client's name an error repeats.
const maxEchoed = 64

// maxEchoedPath bounds the bytes of a request's path an answer or a log
// line repeats (the longest of the API's own is a stored snapshot's, 62).
const maxEchoedPath = 128

// echoPath is the request's path as an answer or a log line repeats it.
func echoPath(r *http.Request) string { return clip(r.URL.Path, maxEchoedPath) }

// Bounds of every error answer (writeErr): a message built elsewhere (the
// config's validation repeats some values) is cut there.
const (
	maxErrPath    = 256
	maxErrMessage = 1024
)

// echoName is s, a name from the request, as an error repeats it: its
// first maxEchoed bytes, cut at a character, and "..." when it is longer.
func echoName(s string) string { return clip(s, maxEchoed) }

// quoteName is echoName quoted, escapes and all.
func quoteName(s string) string { return strconv.Quote(echoName(s)) }

// clip is s cut to at most n bytes (and "..."), at a character boundary;
// s itself when it fits.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// clipPath is an error's path with each name in it cut to maxEchoed bytes
// (the names are the client's keys), and the whole to maxErrPath.
func clipPath(path string) string {
	if len(path) <= maxEchoed {
		return path
	}
	parts := strings.Split(path, ".")
	for i, p := range parts {
		parts[i] = echoName(p)
	}
	return clip(strings.Join(parts, "."), maxErrPath)
}
