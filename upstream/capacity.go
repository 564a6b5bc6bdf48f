package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Global scheduling wire contract between gateways of different regions.
const (
	// CapacityPath is the capacity endpoint every gateway serves (GET),
	// behind the same authentication as its inference endpoints
	// ("Authorization: Bearer <key>"). It answers 200 with a Capacity.
	CapacityPath = "/infera/v1/capacity"

	// HopHeader marks a request forwarded by another region's gateway: the
	// forwarding gateway sets it (value "1") on every request it forwards,
	// and a gateway never forwards a request that carries it, whatever its
	// value (loop prevention). A client sending it only opts out of being
	// forwarded.
	HopHeader = "X-Infera-Hop"

	// ForwardsHeader counts the gateways a request has passed through on
	// its way to an external upstream: every request a gateway sends to a
	// split proxy entry or a member gateway carries the count it arrived
	// with (0 without the header) plus one (AppendHeaders). A gateway
	// sends a request that arrived with MaxForwards or more to none of its
	// split proxy's external entries (only to its local fleet), so a split
	// proxy entry that leads back to the gateway (its own address, or two
	// gateways that list each other) cannot multiply one client request
	// into thousands. A client sending it only opts out of the external
	// entries.
	ForwardsHeader = "X-Infera-Forwards"
	// MaxForwards is the count of ForwardsHeader at which a request goes
	// to no more external split proxy entries: a chain of gateways may be
	// this long (a gateway in front of a gateway in front of an API).
	MaxForwards = 4

	// MaxCapacityBytes bounds a capacity answer read by the Poller.
	MaxCapacityBytes = 1 << 20
	// MaxCapacityModels bounds the models of one report.
	MaxCapacityModels = 4096
	// MaxModelBytes is the longest model name a gateway serves (longer
	// ones are unknown models to its scheduler: sched's maxModelNameLen).
	// Pick forwards no request for a longer name: no member would serve
	// it, and matching a client's megabytes-long name against every
	// member's patterns cost seconds of CPU per request.
	MaxModelBytes = 1024
)

// Capacity is a gateway's report of how much more work it can take now.
//
// Free is the number of requests it would start now without queueing:
// over its routable workers, the sum of (concurrency limit - requests in
// flight), floored at 0; 0 means saturated. Models lists the model names
// a client may ask it for (those of GET /v1/models: served models and
// routing aliases; a name may hold '*', an anchored wildcard, when the
// gateway accepts any model, e.g. with a default model) with the free
// capacity of the workers serving each. Inflight, Queued and Workers are
// informational.
//
//	{"free":12,"inflight":52,"queued":0,"workers":3,
//	 "models":[{"name":"qwen2.5-72b-instruct","free":12},{"name":"*","free":12}]}
//
// Unknown fields are ignored (a newer gateway may report more).
type Capacity struct {
	Free     int             `json:"free"`
	Inflight int             `json:"inflight"`
	Queued   int             `json:"queued"`
	Workers  int             `json:"workers"`
	Models   []ModelCapacity `json:"models"`
}

// ModelCapacity is the free capacity for one model name.
type ModelCapacity struct {
	Name string `json:"name"`
	Free int    `json:"free"`
}

// FreeFor returns the free capacity for model: the largest Free among the
// model entries whose name matches it (as MatchGlob: anchored, ASCII case
// ignored, '*' wildcard), or -1 when the gateway does not serve it. A
// report comes from another gateway: matching takes time linear in each
// name and the model (globFolded), where MatchGlob's backtracking takes
// their product ("*aaa…ab" names cost seconds against a long model name).
// It does not allocate for a model of up to MaxModelBytes.
func (c *Capacity) FreeFor(model []byte) int {
	var buf [MaxModelBytes]byte
	low := appendLower(buf[:0], model)
	best := -1
	for i := range c.Models {
		m := &c.Models[i]
		if m.Free > best && globFolded(m.Name, low) {
			best = m.Free
		}
	}
	return best
}

// maxGlobSegment bounds a literal run of a pattern globFolded lowers on
// the stack (report names are at most 256 bytes).
const maxGlobSegment = 256

// globFolded reports whether pattern matches s as MatchGlob does, s being
// lowercased already (ASCII). The pattern's literal runs between '*'s are
// matched in order: the first at the start of s, the last at its end, each
// other one at its leftmost place after the previous one (leftmost is
// exact for '*' alone: it leaves the most of s to the rest), found with
// bytes.Index (linear time).
func globFolded(pattern string, s []byte) bool {
	star := strings.IndexByte(pattern, '*')
	if star < 0 {
		return equalFold(pattern, s)
	}
	if star > len(s) || !equalFold(pattern[:star], s[:star]) {
		return false
	}
	s, rest := s[star:], pattern[star+1:]
	var seg [maxGlobSegment]byte
	for {
		star = strings.IndexByte(rest, '*')
		if star < 0 {
			return len(rest) <= len(s) && equalFold(rest, s[len(s)-len(rest):])
		}
		part := rest[:star]
		if len(part) > len(seg) {
			// Longer than any report's name: the star before it and the
			// rest of the pattern, as MatchGlob matches them.
			return MatchGlob(pattern[len(pattern)-len(rest)-1:], s)
		}
		rest = rest[star+1:]
		if part == "" {
			continue
		}
		i := bytes.Index(s, appendLower(seg[:0], part))
		if i < 0 {
			return false
		}
		s = s[i+len(part):]
	}
}

// appendLower appends s with ASCII letters lowercased.
func appendLower[T string | []byte](dst []byte, s T) []byte {
	for i := 0; i < len(s); i++ {
		dst = append(dst, lower(s[i]))
	}
	return dst
}

// AppendJSON appends c as JSON (the capacity endpoint's body).
func (c *Capacity) AppendJSON(dst []byte) []byte {
	b, err := json.Marshal(c)
	if err != nil {
		panic(fmt.Sprintf("BUG: cannot encode capacity: %v", err))
	}
	return append(dst, b...)
}

// ParseCapacity decodes and checks a capacity report: one JSON object,
// counts that are non-negative integers, at most MaxCapacityModels named
// models. Error messages never quote the input.
func ParseCapacity(b []byte) (Capacity, error) {
	var c Capacity
	if len(b) > MaxCapacityBytes {
		return c, errors.New("capacity report larger than 1 MiB")
	}
	b = bytes.TrimLeft(b, " \t\r\n") // JSON whitespace only
	if len(b) == 0 || b[0] != '{' {
		return Capacity{}, errors.New("capacity report is not a JSON object")
	}
	if err := json.Unmarshal(b, &c); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Capacity{}, fmt.Errorf("capacity report: field %q has the wrong type", te.Field)
		}
		return Capacity{}, errors.New("capacity report is not valid JSON")
	}
	if c.Free < 0 || c.Inflight < 0 || c.Queued < 0 || c.Workers < 0 {
		return Capacity{}, errors.New("capacity report has a negative count")
	}
	if len(c.Models) > MaxCapacityModels {
		return Capacity{}, fmt.Errorf("capacity report lists more than %d models", MaxCapacityModels)
	}
	for i := range c.Models {
		m := &c.Models[i]
		if m.Name == "" || len(m.Name) > 256 {
			return Capacity{}, fmt.Errorf("capacity report: models[%d] has an empty or overlong name", i)
		}
		if m.Free < 0 {
			return Capacity{}, fmt.Errorf("capacity report: models[%d] has a negative free count", i)
		}
	}
	return c, nil
}
