package config

// Request rate limiting and user rate limiting (configuration center,
// "Request rate limiting" and "User rate limiting").

// RateLimit is request rate limiting (protects the engines).
type RateLimit struct{}

func (r *RateLimit) validate() error { return nil }

// UserLimit is user rate limiting: timezone, quota templates, dry run.
type UserLimit struct{}

func (u *UserLimit) validate(c *Config) error { return nil }

// User is one API user.
type User struct{}
