package mirror

import (
	"bytes"
	"encoding/json"
)

// replaceModel appends to dst the JSON object body with every top-level
// "model" member's value replaced by model (a JSON decoder sees the last
// duplicate; all are replaced so that none survives), and returns it.
// Nested "model" keys (in messages, metadata, tools) are left alone and the
// other bytes are copied untouched. A body that is not a JSON object, or
// has no top-level "model", is appended unchanged.
func replaceModel(dst, body []byte, model string) []byte {
	quoted, err := json.Marshal(model)
	if err != nil {
		return append(dst, body...)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return append(dst, body...)
	}
	var spans [][2]int
	var raw json.RawMessage
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return append(dst, body...)
		}
		key, _ := tok.(string)
		if err := dec.Decode(&raw); err != nil {
			return append(dst, body...)
		}
		if key == "model" {
			end := int(dec.InputOffset())
			spans = append(spans, [2]int{end - len(raw), end})
		}
	}
	last := 0
	for _, s := range spans {
		dst = append(dst, body[last:s[0]]...)
		dst = append(dst, quoted...)
		last = s[1]
	}
	return append(dst, body[last:]...)
}
