// Package lockout limits wrong keys per client address: after Max wrong
// keys within Window an address is locked out for Window, whatever key it
// sends. The admin API and the proxy's data path share it.
//
// It owns the table of addresses and its memory bound; it knows nothing of
// HTTP, keys or answers: the caller asks Locked before it checks a key and
// reports Failed after a wrong one. A caller that also counts wrong keys
// elsewhere (a table shared with other processes) notes each one sent with
// Hold and its answer with Release, and calls Await before Locked, so
// that a lockout the answer tells holds for the address's next request.
package lockout
