package config

import (
	"testing"
)

// BenchmarkEncodeJSON20000Users is one EncodeJSON of a config of 20,000
// users: every admin write encodes the config a few times (the working
// document, the comparison, the file, the audit entry, the ETag), and so
// does a reload's comparison of settings (MarshalFile).
func BenchmarkEncodeJSON20000Users(b *testing.B) {
	c, err := Parse(usersDoc(20000))
	if err != nil {
		b.Fatal(err)
	}
	data, err := EncodeJSON(c, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := EncodeJSON(c, nil); err != nil {
			b.Fatal(err)
		}
	}
}
