package classify

// Tier is a difficulty tier of smart model selection.
type Tier uint8

// The tiers. TierUnknown is no tier (a failed classification before the
// fallback is applied).
const (
	TierUnknown Tier = iota
	TierL1
	TierL2
	TierL3
	numTiers
)

var tierNames = [numTiers]string{"unknown", "L1", "L2", "L3"}

// String returns "L1", "L2", "L3" (or "unknown").
func (t Tier) String() string {
	if t >= numTiers {
		return "unknown"
	}
	return tierNames[t]
}

// ParseTier parses "L1", "L2" or "L3", ignoring ASCII case; anything else
// is TierUnknown.
func ParseTier[T string | []byte](s T) Tier {
	if len(s) != 2 || s[0] != 'L' && s[0] != 'l' {
		return TierUnknown
	}
	switch s[1] {
	case '1':
		return TierL1
	case '2':
		return TierL2
	case '3':
		return TierL3
	}
	return TierUnknown
}
