// Package discovery keeps a fleet.Fleet in step with where workers say they
// are: etcd (EtcdWatcher, with EtcdRegistrar on the worker side) and
// Kubernetes (KubeWatcher, with KubeRegistrar on the worker side). The static
// backend lives with the server's wiring.
//
// Every backend carries the same worker record (fleet.Record as JSON): the
// value of /infera/workers/<id> in etcd, the infera.io/worker annotation of
// the worker's Pod in Kubernetes. A record that does not parse is skipped
// with a rate-limited log line and counted in
// infera_discovery_bad_records_total{backend=...}; it never stops a watcher.
//
// On a backend outage the watchers keep the last known list: the fleet is
// not touched until the backend answers again, and Health() reports the
// outage (also infera_discovery_healthy{backend=...} = 0).
//
// Agrees implements the fleet-wide transport agreement check.
//
// The package knows nothing about HTTP proxying, NATS or the KV index.
package discovery
