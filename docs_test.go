package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"
	"github.com/alecthomas/kong"
	"github.com/infera/infera/config"
	"github.com/infera/infera/engine"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// The project keeps its reference in docs/<topic>.md: every flag of every
// command, every field of the hot-reloadable configuration and every
// Prometheus metric the code exports must be named there. Each test lists
// everything missing, not just the first.

// docPages reads README.md and docs/*.md (benchmarks.md included: it is a
// docs page like the others).
func docPages(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string]string{}
	for _, p := range append(paths, "README.md") {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		pages[p] = string(b)
	}
	if len(pages) < 10 {
		t.Fatalf("only %d docs pages found", len(pages))
	}
	return pages
}

// reportMissing fails t listing every missing item, sorted.
func reportMissing(t *testing.T, what string, missing []string) {
	t.Helper()
	if len(missing) == 0 {
		return
	}
	sort.Strings(missing)
	t.Errorf("%d %s not in docs/*.md:\n\t%s", len(missing), what, strings.Join(missing, "\n\t"))
}

// A flag is documented in its command's own sections (a heading naming
// `infera <command>` and what is under it) when the pages have any, since
// many commands share flag names (--json, --rounds); otherwise anywhere.
func TestEveryFlagOfEveryCommandIsDocumented(t *testing.T) {
	pages := docPages(t)
	all := strings.Join(mapValues(pages), "\n")
	var c = cli // a copy: kong.New writes defaults into its target
	p, err := kong.New(&c, append(config.KongOptions(), kong.Name("infera"))...)
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	flags := 0
	seenEnv := map[string]bool{}
	allWords := flagsAndVars(all)
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		words := allWords
		if sec := commandSections(pages, "infera "+n.Path()); sec != "" {
			words = flagsAndVars(sec)
		}
		for _, f := range n.Flags {
			if f.Name == "help" {
				continue
			}
			flags++
			if !words["--"+f.Name] {
				missing = append(missing, "--"+f.Name+" (infera "+n.Path()+")")
			}
			for _, env := range f.Envs {
				if !seenEnv[env] && !allWords[env] {
					missing = append(missing, env+" (variable of --"+f.Name+")")
				}
				seenEnv[env] = true
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(p.Model.Node)
	if flags < 150 {
		t.Fatalf("only %d flags found: is the walk broken?", flags)
	}
	reportMissing(t, "flags and variables", missing)
}

// docFlagOrVar finds whole flags (`--port`, not a prefix of `--port-file`)
// and upper-case variable names.
var docFlagOrVar = regexp.MustCompile(`--[a-z0-9][a-z0-9-]*|[A-Z][A-Z0-9_]*[A-Z0-9]`)

func flagsAndVars(doc string) map[string]bool {
	words := map[string]bool{}
	// `--[no-]naive` names the negatable --naive.
	for _, w := range docFlagOrVar.FindAllString(strings.ReplaceAll(doc, "--[no-]", "--"), -1) {
		words[w] = true
	}
	return words
}

// commandSections returns the text under every heading that names
// `cmd` (down to the next heading of its level or above), "" if none does.
func commandSections(pages map[string]string, cmd string) string {
	var sb strings.Builder
	for _, doc := range pages {
		level := 0 // of the heading being copied; 0: none
		inFence := false
		for _, line := range strings.Split(doc, "\n") {
			if strings.HasPrefix(line, "```") {
				inFence = !inFence // a fence's "# comment" is no heading
			}
			if h := headingLevel(line); h > 0 && !inFence {
				if level > 0 && h <= level {
					level = 0
				}
				if level == 0 && strings.Contains(line, "`"+cmd+"`") {
					level = h
				}
			}
			if level > 0 {
				sb.WriteString(line)
				sb.WriteByte('\n')
			}
		}
	}
	return sb.String()
}

// headingLevel returns the level of a Markdown heading line, 0 if it is not one.
func headingLevel(line string) int {
	n := len(line) - len(strings.TrimLeft(line, "#"))
	if n == 0 || n > 6 || !strings.HasPrefix(line[n:], " ") {
		return 0
	}
	return n
}

func mapValues(m map[string]string) []string {
	var v []string
	for _, s := range m {
		v = append(v, s)
	}
	return v
}

// A configuration field is documented when a page names its dotted path
// (`timeouts.non_stream_total_s`, `split_proxy.proxies[].status`), or when
// a page that names its parent section (`timeouts`) names the field as
// code or as a JSON key: the pages' convention is a table or list per
// section with the fields' own names.
func TestEveryConfigFieldIsDocumented(t *testing.T) {
	pages := docPages(t)
	words := map[string]map[string]bool{} // page -> code words
	for p, doc := range pages {
		words[p] = codeWords(doc)
	}
	var missing []string
	fields := 0
	walkConfig(reflect.TypeOf(config.Config{}), nil, map[reflect.Type]bool{}, func(path []string) {
		fields++
		if !fieldDocumented(words, path) {
			missing = append(missing, strings.Join(path, "."))
		}
	})
	if fields < 150 {
		t.Fatalf("only %d config fields found: is the walk broken?", fields)
	}
	reportMissing(t, "config fields", missing)
}

// walkConfig calls field with the JSON path of every field of t, the fields
// of the structs within it included (pointers, slices and maps are looked
// through: `split_proxy.proxies[].url` is the path split_proxy, proxies,
// url, and codeWords drops the pages' indexes to match it).
func walkConfig(t reflect.Type, path []string, inPath map[reflect.Type]bool, field func([]string)) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || inPath[t] {
		return
	}
	inPath[t] = true
	defer delete(inPath, t)
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if name == "-" || !sf.IsExported() {
			continue
		}
		if name == "" {
			if sf.Anonymous {
				walkConfig(sf.Type, path, inPath, field)
				continue
			}
			name = sf.Name
		}
		p := append(append([]string(nil), path...), name)
		field(p)
		walkConfig(sf.Type, p, inPath, field)
	}
}

var (
	// codeSpan finds inline code and JSON keys.
	codeSpan = regexp.MustCompile("`[^`\n]+`|\"[A-Za-z0-9_]+\"\\s*:")
	// codeToken finds names, dotted paths and indexes in code.
	codeToken = regexp.MustCompile(`[A-Za-z0-9_.\[\]]+`)
	index     = regexp.MustCompile(`\[[0-9]*\]`)
)

// codeWords returns the words and dotted paths a page writes as code or as
// JSON keys (fenced blocks included: their lines hold the JSON examples).
func codeWords(doc string) map[string]bool {
	w := map[string]bool{}
	add := func(s string) {
		for _, tok := range codeToken.FindAllString(s, -1) {
			tok = strings.Trim(tok, ".")
			w[index.ReplaceAllString(tok, "")] = true
			for _, part := range strings.FieldsFunc(tok, func(r rune) bool { return r == '.' || r == '[' || r == ']' }) {
				w[part] = true
			}
		}
	}
	inFence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			add(line)
			continue
		}
		for _, s := range codeSpan.FindAllString(line, -1) {
			add(s)
		}
	}
	return w
}

func fieldDocumented(words map[string]map[string]bool, path []string) bool {
	full := strings.Join(path, ".")
	leaf := path[len(path)-1]
	for _, w := range words {
		if w[full] {
			return true
		}
		if !w[leaf] {
			continue
		}
		if len(path) == 1 || w[path[len(path)-2]] || w[strings.Join(path[:len(path)-1], ".")] {
			return true
		}
	}
	return false
}

// Metric names are gathered two ways: every string literal of the
// non-test sources that starts with infera_ (up to its labels), and a
// scrape of the series whose names the code builds at run time (the
// engine's, a fleet worker's), which no literal holds whole.
func TestEveryMetricIsDocumented(t *testing.T) {
	pages := docPages(t)
	documented := map[string]bool{}
	for _, doc := range pages {
		for _, name := range metricNamesInDoc(doc) {
			documented[name] = true
		}
	}
	names, prefixes := metricLiterals(t)
	scraped := scrapedMetricNames(t)
	for _, n := range scraped {
		if base, ok := histogramBase(n); ok && names[base] {
			continue // the histogram's own series
		}
		names[n] = true
	}
	for prefix := range prefixes {
		if !slices.ContainsFunc(scraped, func(n string) bool { return strings.HasPrefix(n, prefix) }) {
			t.Errorf("the code builds names from %q at run time and scrapedMetricNames sees none: have it scrape them", prefix)
		}
	}
	if len(names) < 150 {
		t.Fatalf("only %d metric names found: is the scan broken?", len(names))
	}
	var missing []string
	for n := range names {
		if !documented[n] {
			missing = append(missing, n)
		}
	}
	reportMissing(t, "metrics", missing)
}

var metricPrefix = regexp.MustCompile(`^infera_[a-z0-9_]*`)

// metricLiterals returns the metric names the string literals of the
// non-test Go files hold, and apart the literals ending in '_': prefixes
// the code completes at run time (scrapedMetricNames covers those).
func metricLiterals(t *testing.T) (names, prefixes map[string]bool) {
	t.Helper()
	names, prefixes = map[string]bool{}, map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			switch name := metricPrefix.FindString(s); {
			case strings.HasSuffix(name, "_"):
				prefixes[name] = true
			case name != "":
				names[name] = true
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names, prefixes
}

// scrapedMetricNames returns the names of the series an engine and a
// fleet with one worker export, besides whatever the imported packages
// registered in the default set.
func scrapedMetricNames(t *testing.T) []string {
	t.Helper()
	f := fleet.NewFleet(fleet.BreakerConfig{})
	defer f.Close()
	if err := f.Upsert(fleet.Record{ID: "w", URL: "http://127.0.0.1:1", Models: []string{"m"}, Status: fleet.StatusActive}); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	metrics.WritePrometheus(&b, false)

	tm := engine.DefaultTimeModel()
	srv, err := engine.NewServer(engine.Config{
		ID: "docs", Models: []string{"m"}, DefaultMaxTokens: 1, Fault: engine.Fault{Mode: engine.FaultNone},
		Core: engine.CoreConfig{BlockSize: 16, CapacityBlocks: 16, MaxBatch: 1, Time: tm},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/metrics")
	srv.Handler(&ctx)
	b.Write(ctx.Response.Body())

	var names []string
	for _, line := range strings.Split(b.String(), "\n") {
		if name := metricPrefix.FindString(line); name != "" {
			names = append(names, name)
		}
	}
	if !slices.Contains(names, "infera_engine_requests_total") || !slices.Contains(names, "infera_router_worker_routable") {
		t.Fatalf("the scrape lacks the engine's or the worker's series:\n%s", b.String())
	}
	return names
}

// histogramBase returns the histogram name of a _bucket, _sum or _count
// series.
func histogramBase(n string) (string, bool) {
	for _, suffix := range [...]string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(n, suffix); ok {
			return base, true
		}
	}
	return "", false
}

// docMetric finds the metric names a page writes, in its three notations:
// plain (`infera_x_total{label}`), braces for alternatives
// (`infera_kv_index_{blocks,entries,bytes}`) and bars replacing the last
// word (`infera_prefix_index_blocks|bytes|budget_bytes`).
var docMetric = regexp.MustCompile(`infera_[a-z0-9_{},|]*`)

func metricNamesInDoc(doc string) []string {
	var names []string
	for _, m := range docMetric.FindAllString(doc, -1) {
		for _, e := range expandBraces(m) {
			names = append(names, expandBars(e)...)
		}
	}
	return names
}

// expandBraces expands the first {a,b} group of s, recursively. A group
// after a word (not after '_') holds labels and ends the name.
func expandBraces(s string) []string {
	i := strings.IndexByte(s, '{')
	j := strings.IndexByte(s, '}')
	if i > 0 && s[i-1] != '_' {
		return []string{s[:i]}
	}
	if i < 0 || j < i {
		return []string{s}
	}
	var out []string
	for _, alt := range strings.Split(s[i+1:j], ",") {
		out = append(out, expandBraces(s[:i]+alt+s[j+1:])...)
	}
	return out
}

// expandBars expands a|b|c, where b and c replace the words of a after its
// last '_' ("infera_x_state|trips_total": infera_x_state, infera_x_trips_total).
func expandBars(s string) []string {
	alts := strings.Split(s, "|")
	stem := alts[0][:strings.LastIndexByte(alts[0], '_')+1]
	out := []string{alts[0]}
	for _, a := range alts[1:] {
		out = append(out, stem+a)
	}
	return out
}
