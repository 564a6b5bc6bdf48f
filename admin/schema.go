package admin

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"sync"

	"github.com/infera/infera/config"
)

// The console builds its forms from a schema: the structure, types and
// defaults come from config.Config by reflection (so a setting added to
// the config shows up without touching the console), the labels, help and
// choices from the table below (the configuration center doc's names).
// TestSchemaCoversEverySetting fails when a setting has no label.

// Field is one setting, or a group of settings (object) or a list.
type Field struct {
	Key string `json:"key"`
	// Path is the setting's JSON path with [] for list items
	// (canary.rules[].targets[].weight).
	Path  string `json:"path"`
	Label string `json:"label"`
	Help  string `json:"help,omitempty"`
	// Kind is bool, int, float, string, secret, enum, strings, object or
	// list (of objects).
	Kind    string   `json:"kind"`
	Unit    string   `json:"unit,omitempty"`
	Options []string `json:"options,omitempty"`
	// Default is the setting's default (for a list item's field, in a new item).
	Default any `json:"default,omitempty"`
	// Percent: an int field of list items shown with its share of the
	// list's sum (canary and split weights).
	Percent bool `json:"percent,omitempty"`
	// Fields of an object, or of the items of a list.
	Fields []Field `json:"fields,omitempty"`
	// Item is the default of a new list item; ItemLabel names one.
	Item      any    `json:"item,omitempty"`
	ItemLabel string `json:"item_label,omitempty"`
	// Group places a section in the console's navigation.
	Group string `json:"group,omitempty"`
}

type meta struct {
	label, help, unit string
	item              string // the name of one item of a list
	options           []string
	percent           bool
	group             string
}

var efforts = []string{"none", "minimal", "low", "medium", "high", "xhigh"}
var algorithms = []string{"round-robin", "least-requests", "least-tokens"}

// fieldMeta holds the console's names and help, keyed by path.
var fieldMeta = map[string]meta{
	// Fleet
	"workers":                            {label: "Static workers", group: "Fleet", help: "Workers given statically (used with --discovery-backend static, merged with --workers). Discovery backends add their own."},
	"workers[].id":                       {label: "ID", help: "Instance id; defaults to the URL."},
	"workers[].url":                      {label: "URL", help: "Engine base URL, http:// or https://."},
	"workers[].models":                   {label: "Models", help: "Models served; empty: asked from the engine's /v1/models."},
	"workers[].service":                  {label: "Service", help: "Group name for model routing and canary rules; defaults to the first model."},
	"workers[].role":                     {label: "Role", options: []string{"mixed", "prefill", "decode"}},
	"workers[].kv_events_endpoint":       {label: "KV events endpoint", help: "ZMQ endpoint of the engine's KV events (tcp://host:port)."},
	"workers[].kv_replay_endpoint":       {label: "KV replay endpoint", help: "ZMQ replay endpoint of the engine's KV events."},
	"workers[].block_size":               {label: "KV block size", unit: "tokens", help: "The engine's KV block size; 0: --kv-block-size."},
	"workers[].dp_size":                  {label: "Data-parallel size", help: "KV events are followed for each rank (port + rank)."},
	"workers[].bootstrap":                {label: "PD bootstrap", help: "A PD prefill worker's bootstrap data (as infera worker --bootstrap advertises it)."},
	"workers[].bootstrap.pd_mode":        {label: "PD mode", options: []string{"sglang", "vllm"}},
	"workers[].bootstrap.bootstrap_host": {label: "Bootstrap host", help: "Default: the worker URL's host."},
	"workers[].bootstrap.bootstrap_port": {label: "Bootstrap port", help: "SGLang bootstrap port or vLLM side-channel port of the prefill engine."},

	// Scheduling policy
	"load_balancing":           {label: "Load balancing", group: "Scheduling", help: "Layer 3 of the primary scheduling policy: when neither session affinity nor prefix caching matches, the algorithm picks the instance."},
	"load_balancing.algorithm": {label: "Algorithm", options: algorithms, help: "least-tokens: fewest tokens in flight (large token length variance). least-requests: fewest active requests (similar processing times). round-robin: in turn (uniform instances, stable load)."},

	"session_affinity":                     {label: "Session affinity", group: "Scheduling", help: "Layer 1: requests of the same session go to the same instance, so multi-turn conversations keep their context. Requests must carry the session header; others fall through to prefix caching."},
	"session_affinity.enabled":             {label: "Enabled"},
	"session_affinity.mode":                {label: "Affinity mode", options: []string{"soft", "strong"}, help: "strong: always the bound instance while it is routable. soft: skip it while its load exceeds average load × soft max load ratio."},
	"session_affinity.header":              {label: "Session header", help: "The HTTP header holding the session id. Claude Code sends X-Claude-Code-Session-Id by itself; other clients (OpenAI/Anthropic SDKs, LangChain) must inject a header."},
	"session_affinity.ttl_s":               {label: "Session TTL", unit: "s", help: "Time-to-live of a session binding; expired entries are removed."},
	"session_affinity.max_entries":         {label: "Max entries", help: "Most session records kept; the oldest are evicted beyond it."},
	"session_affinity.soft_max_load_ratio": {label: "Soft max load ratio", help: "Soft mode only: when the preferred instance's load exceeds average load × this ratio, a less loaded instance is chosen."},
	"session_affinity.require_session_id":  {label: "Require session ID", help: "Reject inference requests without the session header with HTTP 400 before they are queued or scheduled (only while session affinity is enabled)."},

	"prefix_cache":                           {label: "Prefix caching", group: "Scheduling", help: "Layer 2: prefer the instance that already caches the longest prefix of the prompt (fixed system prompts, batch document processing). Misses fall through to load balancing."},
	"prefix_cache.enabled":                   {label: "Enabled"},
	"prefix_cache.load_tolerance_factor":     {label: "Load tolerance factor", help: "A cache-hit instance whose load exceeds average load × (1 + factor) is skipped."},
	"prefix_cache.pending_request_threshold": {label: "Pending request threshold", help: "An instance with more requests waiting for their first token is considered overloaded, even on a cache hit."},
	"prefix_cache.hit_rate_threshold":        {label: "Hit rate threshold", help: "A match shorter than this share of the prompt counts as a miss (0–1)."},

	"prefix_index":                        {label: "Prefix index", group: "Scheduling", help: "The persistent prefix index that estimates the cache hit-rate ceiling and, with prefix caching, is the routing match basis: its memory bound and cleanup cycle."},
	"prefix_index.ttl_s":                  {label: "Cache TTL", unit: "s", help: "Time-to-live of index entries (default 3 days). Reduce to 3600 when sessions end within the hour and memory is tight."},
	"prefix_index.maintenance_interval_s": {label: "Maintenance interval", unit: "s", help: "Period of the background sweep of expired entries. Increase only under persistently high CPU."},
	"prefix_index.memory_threshold_ratio": {label: "Memory threshold ratio", help: "Evict least recently used entries when process memory exceeds container memory × ratio (0 means 0.70). Lower on OOM; raise when entries are evicted too early."},
	"prefix_index.reserved_memory_gb":     {label: "Reserved memory", unit: "GB", help: "Evict when process memory exceeds container memory − this (0 means 1.5 GB). The lower trigger wins."},
	"prefix_index.block_size":             {label: "Block size", unit: "bytes", help: "Index block length. Changing it starts a fresh index (the hit rate drops until it refills); prompts shorter than a block are not indexed."},

	"pd":                            {label: "PD disaggregation", group: "Scheduling", help: "Prefill-decode disaggregated deployments: the decode phase's own scheduling policy. The prefill role uses the primary policy."},
	"pd.mode":                       {label: "PD disaggregation mode", help: "sglang (push) or vllm (pull), matching the engines; empty: from the prefill worker's record."},
	"pd.prefill_timeout_s":          {label: "Prefill leg timeout", unit: "s", help: "Longest wait for a prefill leg's complete answer; on expiry the prefill worker is blamed and the request goes to another prefill worker. 0: no limit."},
	"pd.decode_policy":              {label: "Decode scheduling policy", options: algorithms, help: "Load balancing algorithm of the decode role."},
	"pd.sglang_independent_pairing": {label: "SGLang PD independent pairing", help: "SGLang Mooncake only: pair prefill and decode instances freely."},

	"sched_timeout":                    {label: "Scheduling timeout & breaker", group: "Scheduling", help: "A scheduling decision that takes too long falls back to local round-robin; when timeouts persist the breaker opens and probes after a cooldown."},
	"sched_timeout.breaker_enabled":    {label: "Circuit breaker", help: "Off reverts to pure timeout fallback (for troubleshooting); the wait timeout still applies."},
	"sched_timeout.wait_timeout_ms":    {label: "Scheduling wait timeout", unit: "ms", help: "Longest wait for one scheduling decision (0: no limit)."},
	"sched_timeout.trip_failure_ratio": {label: "Trip failure ratio", help: "Failed / total decisions over a 10 s rolling window (at least 10 samples) that opens the breaker."},
	"sched_timeout.cooldown_s":         {label: "Breaker cooldown", unit: "s", help: "How long the breaker stays open before a probe."},
	"sched_timeout.probe_wait_ms":      {label: "Probe wait limit", unit: "ms", help: "Time limit of the probe decision; success closes the breaker, failure reopens it."},

	// Routing
	"model_routing":                     {label: "Model routing", group: "Routing", help: "Route by the request's model field to the services that serve it."},
	"model_routing.enabled":             {label: "Enabled"},
	"model_routing.default_model":       {label: "Default model", help: "Serves requests without a model or with an unmatched one; empty: unmatched requests get 404."},
	"model_routing.fuzzy_match":         {label: "Fuzzy match", help: "Different notations match (case, separators, org prefix), abbreviations match the full name, and * is a wildcard. Off: only case and separator variants of the exact name."},
	"model_routing.mappings":            {label: "Model mapping", item: "Mapping", help: "Tried top to bottom; the first match routes only to its services. Anchored, case-insensitive, * wildcard."},
	"model_routing.mappings[].pattern":  {label: "Model pattern"},
	"model_routing.mappings[].services": {label: "Services"},

	"canary":                           {label: "Service canary", group: "Routing", help: "Distribute traffic across services by weight (canary releases, A/B tests). Rules are tried top to bottom; the first match takes effect."},
	"canary.enabled":                   {label: "Enabled"},
	"canary.rules":                     {label: "Canary rules"},
	"canary.rules[].model":             {label: "Model", help: "Model pattern; * matches all models."},
	"canary.rules[].targets":           {label: "Targets"},
	"canary.rules[].targets[].service": {label: "Service"},
	"canary.rules[].targets[].weight":  {label: "Weight", percent: true, help: "Traffic weight; the share is shown as a percentage."},

	"split_proxy":                          {label: "Split proxy", group: "Routing", help: "Forward part of the traffic to external upstream APIs next to the local service, with failover. Not counted by request rate limiting."},
	"split_proxy.enabled":                  {label: "Enabled"},
	"split_proxy.strategy":                 {label: "Splitting strategy", options: []string{"weight", "prefix"}, help: "weight: by the proxies' weights, whatever the model. prefix: the first proxy whose model rules match."},
	"split_proxy.proxies":                  {label: "Proxy list", item: "Proxy", help: "At least one local service entry plus any external upstreams; list order is the order of prefix matching and failover."},
	"split_proxy.proxies[].name":           {label: "Name"},
	"split_proxy.proxies[].local":          {label: "Local service", help: "The gateway's own fleet."},
	"split_proxy.proxies[].status":         {label: "Status", options: []string{"enabled", "disabled"}},
	"split_proxy.proxies[].address":        {label: "Proxy address", help: "Base URL of the upstream API."},
	"split_proxy.proxies[].api_key":        {label: "API key", help: "Sent upstream as a bearer token. env:NAME / file:PATH references can be set only in the config file."},
	"split_proxy.proxies[].weight":         {label: "Weight", percent: true, help: "Share under the weight strategy."},
	"split_proxy.proxies[].model_rules":    {label: "Model rules", help: "Prefix strategy: model prefixes or * patterns."},
	"split_proxy.proxies[].failover":       {label: "Failover", help: "Retry target (in list order) when others fail."},
	"split_proxy.non_stream_first_byte_ms": {label: "External non-stream first byte timeout", unit: "ms", help: "An external proxy that sends no answer to a non-streamed request within it times out and the request fails over; 0: the general timeouts only."},
	"split_proxy.timeout_backoff_ms":       {label: "Timed-out proxy backoff", unit: "ms", help: "An external proxy that timed out before its first byte is skipped for this long, then one request tries it; doubles after a failed try. 0: only its breaker skips it."},
	"split_proxy.timeout_max_backoff_ms":   {label: "Timed-out proxy max backoff", unit: "ms"},

	"mirror":                  {label: "Traffic mirroring", group: "Routing", help: "Copy sampled live requests to a target address; its answers never affect clients."},
	"mirror.enabled":          {label: "Enabled"},
	"mirror.target_address":   {label: "Target address"},
	"mirror.target_model":     {label: "Target model", help: "Model substituted in mirrored requests; empty keeps the original."},
	"mirror.sampling_ratio":   {label: "Sampling ratio", unit: "%", help: "Share of requests mirrored (0–100)."},
	"mirror.auth_token":       {label: "Auth token"},
	"mirror.timeout_ms":       {label: "Timeout", unit: "ms", help: "Expired mirror requests are dropped."},
	"mirror.log_recording":    {label: "Log recording", help: "One log line per mirrored request."},
	"mirror.queue_size":       {label: "Queue size", help: "Sampled requests waiting for a sender; beyond it they are dropped."},
	"mirror.concurrency":      {label: "Concurrency", help: "Mirrored requests in flight at once."},
	"mirror.max_buffer_bytes": {label: "Max buffered bytes", unit: "bytes", help: "Bound on request copies held (queued and in flight); 0 means 256 MiB."},

	"global_scheduling":                                  {label: "Global scheduling", group: "Routing", help: "When local resources are scarce, forward traffic to idle InferX gateways in other regions."},
	"global_scheduling.enabled":                          {label: "Enabled"},
	"global_scheduling.members":                          {label: "Members"},
	"global_scheduling.members[].name":                   {label: "Member name"},
	"global_scheduling.members[].url":                    {label: "URL"},
	"global_scheduling.members[].api_key":                {label: "Token"},
	"global_scheduling.poll_interval_ms":                 {label: "Poll interval", unit: "ms"},
	"global_scheduling.poll_timeout_ms":                  {label: "Poll timeout", unit: "ms"},
	"global_scheduling.stale_after_ms":                   {label: "Stale after", unit: "ms"},
	"global_scheduling.min_free":                         {label: "Minimum free capacity"},
	"global_scheduling.forward_stream_first_packet_ms":   {label: "Forwarded stream first packet timeout", unit: "ms", help: "A member that sends no first event within it is marked failed and the request fails over; 0: the general timeouts only."},
	"global_scheduling.forward_non_stream_first_byte_ms": {label: "Forwarded non-stream first byte timeout", unit: "ms", help: "A member that sends no answer within it is marked failed and the request fails over; 0: the general timeouts only."},
	"global_scheduling.forward_failure_backoff_ms":       {label: "Failed member backoff", unit: "ms", help: "A member whose forward failed (unreachable, timeout, 5xx) takes no forward for this long, whatever its polls say; then one request tries it. Doubles after a failed try; 0: until its next good poll only."},
	"global_scheduling.forward_failure_max_backoff_ms":   {label: "Failed member max backoff", unit: "ms"},
	"global_scheduling.forward_stall_ms":                 {label: "Stalled member bound", unit: "ms", help: "A member with a forward waiting this long for its first byte, and no forward answered meanwhile, takes no new forward until it answers one; 0: off."},

	"smart_model_selection":                           {label: "Smart model selection", group: "Routing", help: "A classifier picks the L1/L2/L3 tier model per request (cost optimisation). Incompatible with weight-based splitting."},
	"smart_model_selection.enabled":                   {label: "Enabled"},
	"smart_model_selection.classifier_url":            {label: "Classifier URL"},
	"smart_model_selection.classifier_api_key":        {label: "Classifier API key"},
	"smart_model_selection.timeout_ms":                {label: "Timeout", unit: "ms"},
	"smart_model_selection.fallback_tier":             {label: "Fallback tier", options: []string{"L1", "L2", "L3"}},
	"smart_model_selection.tiers":                     {label: "Tier models"},
	"smart_model_selection.tiers.L1":                  {label: "L1 model"},
	"smart_model_selection.tiers.L2":                  {label: "L2 model"},
	"smart_model_selection.tiers.L3":                  {label: "L3 model"},
	"smart_model_selection.match_models":              {label: "Match models", help: "Apply only to these model patterns; empty: all."},
	"smart_model_selection.max_text_bytes":            {label: "Max text", unit: "bytes"},
	"smart_model_selection.breaker_failure_threshold": {label: "Classifier breaker threshold", help: "Failed classifier calls in a row before it is skipped (the fallback tier at once) for the cooldown; 0: no breaker."},
	"smart_model_selection.breaker_cooldown_ms":       {label: "Classifier breaker cooldown", unit: "ms", help: "How long the classifier is skipped before one request probes it; doubles after a failed probe."},
	"smart_model_selection.breaker_max_cooldown_ms":   {label: "Classifier breaker max cooldown", unit: "ms"},

	// Traffic protection
	"rate_limit":                     {label: "Request rate limiting", group: "Protection", help: "Concurrency limits that protect the inference instances; over the limit, reject or queue. 0 means no limit."},
	"rate_limit.scope":               {label: "Rate limit scope", options: []string{"instance", "service", "gateway"}, help: "What one counter covers: each instance, the instances of one service, or the whole gateway."},
	"rate_limit.overlimit":           {label: "Overlimit handling", options: []string{"reject", "queue"}, help: "reject: 429 at once. queue: wait in a bounded FIFO queue."},
	"rate_limit.overall_concurrency": {label: "Overall concurrency limit", help: "Dispatch to response end; PD-integrated deployments only."},
	"rate_limit.prefill_concurrency": {label: "Prefill concurrency limit", help: "Dispatch to first token (queuing + prefill)."},
	"rate_limit.decode_concurrency":  {label: "Decode concurrency limit", help: "First token to response end; PD-disaggregated decode instances only."},
	"rate_limit.queue_size":          {label: "Queue size"},
	"rate_limit.queue_timeout_ms":    {label: "Queue timeout", unit: "ms"},
	"rate_limit.dry_run":             {label: "Dry run", help: "Evaluate and count, block nothing: observe first, then enforce."},
	"rate_limit.on_state_error":      {label: "When Redis is unreachable", options: []string{"open", "closed"}, help: "open admits, closed answers 503."},

	"user_limit":                                          {label: "User rate limiting", group: "Protection", help: "Per-user request and token quotas through quota templates bound to users; users without a template use the default one."},
	"user_limit.timezone":                                 {label: "Timezone", help: "IANA timezone of allowed calling periods and of day/week/month quota boundaries."},
	"user_limit.dry_run":                                  {label: "Dry run (global)", help: "Rules are evaluated and hit counts recorded, but nothing is blocked."},
	"user_limit.on_state_error":                           {label: "When Redis is unreachable", options: []string{"open", "closed"}},
	"user_limit.metrics_max_users":                        {label: "Users with metric series"},
	"user_limit.templates":                                {label: "Quota templates"},
	"user_limit.templates[].name":                         {label: "Name"},
	"user_limit.templates[].default":                      {label: "Default template", help: "Users without a bound template use it."},
	"user_limit.templates[].dry_run":                      {label: "Dry run"},
	"user_limit.templates[].periods":                      {label: "Allowed calling period", help: "Local time segments, inclusive, minute precision; a period across midnight is two segments."},
	"user_limit.templates[].periods.enabled":              {label: "Enabled"},
	"user_limit.templates[].periods.segments":             {label: "Segments"},
	"user_limit.templates[].periods.segments[].days":      {label: "Days", options: []string{"mon", "tue", "wed", "thu", "fri", "sat", "sun"}, help: "None selected: every day."},
	"user_limit.templates[].periods.segments[].start":     {label: "From", help: "HH:MM"},
	"user_limit.templates[].periods.segments[].end":       {label: "To", help: "HH:MM (inclusive)"},
	"user_limit.templates[].quota":                        {label: "Quota", help: "Periodic request and weighted-token quotas."},
	"user_limit.templates[].quota.enabled":                {label: "Enabled"},
	"user_limit.templates[].quota.weights":                {label: "Token weights"},
	"user_limit.templates[].quota.weights.input":          {label: "Input", help: "Input tokens that missed the cache."},
	"user_limit.templates[].quota.weights.output":         {label: "Output"},
	"user_limit.templates[].quota.weights.cached":         {label: "Cached", help: "Input tokens served from the cache."},
	"user_limit.templates[].quota.windows":                {label: "Quota windows"},
	"user_limit.templates[].quota.windows[].period":       {label: "Period", options: []string{"5h", "day", "week", "month"}},
	"user_limit.templates[].quota.windows[].max_requests": {label: "Max requests", help: "0: no limit."},
	"user_limit.templates[].quota.windows[].max_tokens":   {label: "Max weighted tokens", help: "0: no limit."},
	"user_limit.templates[].concurrency":                  {label: "Concurrency limit"},
	"user_limit.templates[].concurrency.enabled":          {label: "Enabled"},
	"user_limit.templates[].concurrency.limit":            {label: "Max concurrent requests"},
	"user_limit.templates[].concurrency.overlimit":        {label: "Overlimit handling", options: []string{"reject", "queue"}},
	"user_limit.templates[].concurrency.queue_size":       {label: "Queue size"},
	"user_limit.templates[].concurrency.queue_timeout_ms": {label: "Queue timeout", unit: "ms"},
	"user_limit.templates[].rate":                         {label: "Rate limit (RPM/TPM)", help: "Token buckets per minute."},
	"user_limit.templates[].rate.enabled":                 {label: "Enabled"},
	"user_limit.templates[].rate.rpm":                     {label: "RPM", help: "Requests per minute; 0: no limit."},
	"user_limit.templates[].rate.tpm":                     {label: "TPM", help: "Tokens per minute; 0: no limit."},
	"user_limit.templates[].rate.default_output_tokens":   {label: "Default output estimate", unit: "tokens", help: "Pre-deducted for TPM when a request has no max_tokens."},

	"users":            {label: "Users", group: "Protection"},
	"users[].name":     {label: "Name"},
	"users[].keys":     {label: "Key hashes"},
	"users[].template": {label: "Quota template"},
	"users[].enabled":  {label: "Enabled"},
	"users[].models":   {label: "Models", help: "Models the user may call: names or * patterns, case-insensitive. Empty: every model."},

	// Advanced
	"timeouts":                       {label: "Request timeout", group: "Advanced", help: "Timeouts from the gateway to the inference services. 0 means no limit."},
	"timeouts.stream_first_packet_s": {label: "Streaming first-packet timeout", unit: "s"},
	"timeouts.stream_idle_s":         {label: "Streaming idle timeout", unit: "s", help: "Longest gap between two packets."},
	"timeouts.stream_total_s":        {label: "Streaming total timeout", unit: "s"},
	"timeouts.non_stream_total_s":    {label: "Non-streaming total timeout", unit: "s"},

	"protocol":                                    {label: "Protocol and conversion", group: "Advanced", help: "API passthrough and message conversion for clients and models."},
	"protocol.responses_passthrough":              {label: "Responses API passthrough", help: "On: the engines serve /v1/responses. Off: converted to chat completions."},
	"protocol.anthropic_passthrough":              {label: "Anthropic API passthrough", help: "On: the engines serve /v1/messages. Off: converted to chat completions."},
	"protocol.preserve_anthropic_system_position": {label: "Preserve Anthropic System message position"},
	"protocol.force_stream_usage":                 {label: "Force streaming usage return", help: "Send the usage chunk even when the client did not ask for it."},
	"protocol.reasoning_effort_mode":              {label: "Reasoning effort mapping mode", options: []string{"passthrough", "map", "drop"}},
	"protocol.reasoning_map":                      {label: "Reasoning map"},
	"protocol.reasoning_map.target":               {label: "Target", options: []string{"enable_thinking", "reasoning_effort", "both"}},
	"protocol.reasoning_map.thinking_off_efforts": {label: "Thinking off for", options: efforts},
	"protocol.reasoning_map.budget_low_max":       {label: "Low budget up to", unit: "tokens"},
	"protocol.reasoning_map.budget_medium_max":    {label: "Medium budget up to", unit: "tokens"},
	"protocol.responses_state_ttl_s":              {label: "Stored responses TTL (Redis)", unit: "s", help: "With --state redis: how long a stored Response's record (its engine and user) stays in Redis after its create, so other routers find it. 0 means a day; 60 s to 30 days. Applies to the records made after a change."},

	"debug":                 {label: "Debug", group: "Advanced"},
	"debug.decision_header": {label: "Decision header", help: "Add X-Infera-Worker and X-Infera-Route to responses."},

	"backup":            {label: "Data backup", group: "Advanced", help: "Snapshots of the management data into --persist-snapshot-dir. Changes take effect after the next backup cycle. Not used with Redis."},
	"backup.interval_s": {label: "Backup frequency", unit: "s"},
	"backup.keep":       {label: "Keep", help: "Snapshots kept per kind (rotation)."},

	"llm_gateway":                      {label: "Backup directory (startup)", group: "Advanced", help: "The startup configuration of data backup: read once at start (as --persist-snapshot-dir, which wins when given); a change takes effect at the next start."},
	"llm_gateway.persist_snapshot_dir": {label: "Snapshot directory", help: "Absolute path; with storage mounts, inside a writable one."},
	"storage":                          {label: "Storage mounts (startup)", group: "Advanced", item: "mount", help: "The platform's storage mounts (the platform mounts them; infera checks the snapshot directory lies inside one)."},
	"storage[].mount_path":             {label: "Mount path"},
	"storage[].oss":                    {label: "OSS"},
	"storage[].oss.path":               {label: "Bucket path", help: "oss://bucket/prefix/"},
	"storage[].oss.read_only":          {label: "Read only"},
	"storage[].oss.type":               {label: "Type", help: "e.g. ossfs"},
}

var (
	schemaOnce sync.Once
	schemaJSON []byte
)

func (a *Admin) getSchema(w http.ResponseWriter, r *http.Request) error {
	schemaOnce.Do(func() {
		data, err := json.Marshal(map[string]any{"sections": buildSchema()})
		if err != nil {
			panic("BUG: schema: " + err.Error())
		}
		schemaJSON = data
	})
	w.Header().Set("Cache-Control", "no-cache")
	writeRaw(w, http.StatusOK, schemaJSON)
	return nil
}

// buildSchema describes every section of config.Config.
func buildSchema() []Field {
	defs := toDoc(config.Default())
	t := reflect.TypeFor[config.Config]()
	return structFields(t, "", defs)
}

// toDoc renders a Go value as decoded JSON (secrets redacted).
func toDoc(v any) map[string]any {
	var data []byte
	var err error
	if c, ok := v.(*config.Config); ok {
		data, err = (*sealer)(nil).encodeRedacted(c) // the defaults: no secret set
	} else {
		data, err = json.Marshal(v)
	}
	if err != nil {
		return nil
	}
	m, _ := decodeDoc(data)
	return m
}

func structFields(t reflect.Type, path string, defs map[string]any) []Field {
	var out []Field
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if !sf.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		p := join(path, name)
		out = append(out, describe(sf.Type, name, p, defs[name]))
	}
	return out
}

func describe(t reflect.Type, key, path string, def any) Field {
	m := fieldMeta[path]
	f := Field{Key: key, Path: path, Label: m.label, Help: m.help, Unit: m.unit, Options: m.options, Percent: m.percent, Group: m.group, ItemLabel: m.item}
	if f.Label == "" {
		f.Label = humanize(key)
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == secretType:
		f.Kind = "secret"
	case t.Kind() == reflect.Bool:
		f.Kind = "bool"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		f.Kind = "int"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		f.Kind = "float"
	case t.Kind() == reflect.String:
		f.Kind = "string"
		if len(f.Options) > 0 {
			f.Kind = "enum"
		}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		f.Kind = "strings"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		f.Kind = "list"
		item := itemDefault(t.Elem())
		f.Item = item
		f.Fields = structFields(t.Elem(), path+"[]", item)
	case t.Kind() == reflect.Struct:
		f.Kind = "object"
		dm, _ := def.(map[string]any)
		f.Fields = structFields(t, path, dm)
	default:
		f.Kind = "string"
	}
	if f.Kind != "object" && f.Kind != "list" {
		f.Default = def
	}
	return f
}

// itemDefault is a new list item: what decoding {} gives (types with their
// own decoder apply their defaults).
func itemDefault(t reflect.Type) map[string]any {
	v := reflect.New(t)
	if u, ok := v.Interface().(json.Unmarshaler); ok {
		if err := u.UnmarshalJSON([]byte("{}")); err != nil {
			return toDoc(reflect.Zero(t).Interface())
		}
	}
	return toDoc(v.Elem().Interface())
}

func humanize(key string) string {
	s := strings.ReplaceAll(key, "_", " ")
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
