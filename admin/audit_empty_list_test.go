package admin

import (
	"strings"
	"testing"
)

// The console saves [] where a list was null (a template created through
// the API has "segments": null), and the admin takes the two for the same
// (no new version for an unchanged form). The audit log listed each as a
// change all the same: saving the Quota templates page after adding one
// template listed "periods.segments: null → []" and "quota.windows: null →
// []" for every other template, ahead of the real change.
func TestTheAuditLogDoesNotListAnEmptyListForNone(t *testing.T) {
	old := mustParse(t, `{"user_limit":{"templates":[{"name":"gold"}]}}`)
	cur := mustParse(t, `{"user_limit":{"templates":[{"name":"gold","periods":{"segments":[]},"quota":{"windows":[]}}]},"canary":{"rules":[]}}`)
	if ch := diff(nil, old, cur); len(ch) != 0 {
		t.Fatalf("null to [] listed as changes: %+v", ch)
	}
	if ch := diff(nil, cur, old); len(ch) != 0 {
		t.Fatalf("[] to null listed as changes: %+v", ch)
	}
	// Where the two differ (absent: the default efforts; []: none), it is
	// a change, as the admin counts it.
	old = mustParse(t, `{}`)
	cur = mustParse(t, `{"protocol":{"reasoning_map":{"thinking_off_efforts":[]}}}`)
	ch := diff(nil, old, cur)
	if len(ch) == 0 || !strings.Contains(ch[0].Path, "thinking_off_efforts") {
		t.Fatalf("thinking_off_efforts from absent to []: %+v, want it listed", ch)
	}
}
