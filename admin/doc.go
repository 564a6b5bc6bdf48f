// Package admin is the configuration center: the admin API and web console
// on their own listener, versions and audit of every change, snapshots
// (backup, export, import) and Redis storage of the management data.
//
// The management data is one config.Config (every section, users and quota
// templates included; API keys only as salted hashes). Every change, from
// the API, the console, an import or a replica catching up through Redis,
// ends in the same atomic snapshot swap of config.Store as a file reload,
// so the request path never sees a half-applied change.
//
// It must not know about the request path: the fleet view and rule hit
// counters come through the small Fleet interface, which the router
// implements.
package admin
