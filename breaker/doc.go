// Package breaker is the circuit breaker state machine of infera: the
// router's breaker of each worker and external upstream (package fleet),
// the scheduling breaker (package sched) and the smart model selection
// classifier's breaker (package classify) are this one type with their own
// settings.
//
// A Breaker is closed, open or half-open. Closed, it admits every request
// and watches their outcomes; a trip rule (failures in a row, or a failure
// ratio over a rolling window) opens it. Open, it admits nothing for a
// cooldown; then one request, the trial, is admitted and the breaker is
// half-open while it runs: the trial's success closes it, its failure
// opens it again for twice the last cooldown (up to a cap), and a trial
// that ends with neither (Abandon) hands the slot to the next request. Only
// the trial settles a half-open breaker: the outcome of a request admitted
// before the breaker opened is stale and ignored.
//
// Settings are passed to every call, so a reload of them applies at once,
// to an open breaker's cooldown too. Every method is safe for concurrent
// use and allocation-free; the zero Breaker is closed.
//
// The package knows nothing of workers, requests, metrics or
// configuration files: its users map their outcomes to Success, Failure
// and Abandon and export State and Trips as they see fit.
package breaker
