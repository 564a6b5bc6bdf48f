// Package upstream holds what the request path needs to send a request
// somewhere other than the local fleet, as pure data and small components
// the dispatch plugs in as transports:
//
//   - Endpoint: an upstream base URL (split proxy address, member URL,
//     mirror target) parsed once, joined with a request path without
//     doubling "/v1".
//   - Plan and Splitter (split proxy): which proxies of
//     config.SplitProxy to try for a request, in order: the weighted or
//     model-rule choice, then the failover targets in list order.
//   - Capacity, CapacityPath, HopHeader (global scheduling): the JSON a
//     gateway reports on its authenticated capacity endpoint, and the header
//     that marks a request already forwarded by another region.
//   - Poller (global scheduling): polls every member's capacity endpoint
//     and keeps its last report; Pick names the member with the most free
//     capacity for a model.
//   - AppendHeaders: the header block of a request to an external upstream
//     (its key instead of the client's credentials, client headers from a
//     fixed list, HopHeader, ForwardsHeader: how many gateways the
//     request passed, so a split proxy entry leading back to the gateway
//     cannot loop). The proxy sends it over its own HTTP/1.1
//     client, the one it uses for local engines.
//   - DescribeError: transport failures in fixed words for log lines.
//
// It knows nothing of the proxy, the scheduler or the dispatch that will
// carry the requests: it depends on config and fasthttp only.
package upstream
