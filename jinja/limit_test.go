package jinja

import (
	"fmt"
	"testing"
)

// A render stopped by a bound of Options is told apart from one the
// template or its data refused: the router routes the first without block
// hashes and answers the second as the client's error.
func TestRenderLimitsAreToldApartFromTemplateErrors(t *testing.T) {
	for _, tc := range []struct {
		src   string
		opts  Options
		limit bool
	}{
		{`{% for i in range(100000) %}x{% endfor %}`, Options{MaxSteps: 1000}, true},
		{`{% for i in range(100) %}xxxxxxxxxx{% endfor %}`, Options{MaxOutput: 1 << 16}, false},
		{`{% for i in range(3000000) %}xxxxxxxxxx{% endfor %}`, Options{}, true}, // past MaxOutput
		{`{{ raise_exception("no user turn") }}`, Options{}, false},
		{`{{ 1 / 0 }}`, Options{}, false},
	} {
		tpl, err := ParseWithOptions(tc.src, tc.opts)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		_, err = tpl.Render(nil, nil)
		if tc.limit != IsLimit(err) || (tc.limit && err == nil) {
			t.Fatalf("%s: err %v, IsLimit %v, want %v", tc.src, err, IsLimit(err), tc.limit)
		}
		if IsLimit(fmt.Errorf("wrapped: %w", err)) != tc.limit {
			t.Fatalf("%s: IsLimit does not see through wrapping", tc.src)
		}
	}
}
