package config

// Protocol is the "Protocol and conversion" section.
type Protocol struct{}

func (p *Protocol) validate() error { return nil }
