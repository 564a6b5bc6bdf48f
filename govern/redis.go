package govern

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/infera/infera/internal/logx"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Redis key layout (prefix "infera:" by default; {...} group a user's keys
// and the seat keys, though a request's admission script touches both: one
// Redis server, not a cluster):
//
//	<p>{u:<user>}            hash: rl rt (RPM bucket level, last ms), tl tt
//	                         (TPM), w<i>s w<i>r w<i>k (window i = 0 5h, 1
//	                         day, 2 week, 3 month: start, requests, milli
//	                         weighted tokens)
//	<p>{u:<user>}:seats      sorted set: the user's concurrency slots,
//	                         member = ticket id, score = lease expiry (ms)
//	<p>{u:<user>}:f:<ticket> string: "a <start> x4", the record of an
//	                         admission (the windows it counted in), then
//	                         "1", the mark of its settlement (finishLua)
//	<p>{rl}:i:<instance>:<c> sorted set: seats of counter c (overall,
//	<p>{rl}:s:<service>:<c>  prefill, decode) of an instance, a service or
//	<p>{rl}:g:<c>            the gateway; member = seat id, score = expiry
//	<p>{rl}:f:<seat id>      string: "1", the mark of the return of a
//	                         seat call whose answer was lost (undoSeat)
//	<p>wake                  pub/sub channel: "u:<user>" or "rl" when a
//	                         slot or seat is given back
//	<p>resp:<id>             a stored Response's record (records.go)
//	<p>lockout:<table>...    wrong keys per client address (lockout.go)

// admitLua is the user admission: KEYS are the user's hash, slot set and
// the ticket's mark (finishLua), A its arguments (admitArgs): now, member,
// lease expiry, concurrency limit, RPM, TPM, TPM need, TPM estimate, dry,
// key TTL, then per period start (0: not taken), max requests, max
// tokens, estimate, then its deadline (Unix ms, callLife after it was
// made). It returns {failed rules (bit set of codes), RPM retry
// ms, TPM retry ms, RPM level, TPM level, then per period the start of the
// window it counts in (0: not taken)}, each level as the admission left
// it in two values, whole units (floor, at least -4e18) and millionths
// (0 when the rule is off); a window's start is a
// later one than the argument's when another router began that window
// already (a late admission counts there, and its end is settled there).
//
// An admission that takes something records it in the mark ("a" and the
// start of the window it counted in per period, for admitRecord), so that
// its return after an ambiguous failure (endUnadmit: its answer lost)
// gives back exactly what it took; one that finds the mark set runs after
// that return (it was held in a stalled connection): it takes nothing and
// returns {-1, ...}. One that Redis reads past its deadline (by Redis's
// clock, TIME) may run after its return's mark expired: it takes nothing
// and returns {-2, Redis's time (ms), ...} (callLife).
var admitLua = winCountLua + fmt.Sprintf(`
local function level(l)
  if l == nil or l ~= l then return 0, 0 end
  if l < -4e18 then return -4e18, 0 end
  local w = math.floor(l)
  local m = math.floor((l - w) * 1000000 + 0.5)
  if m >= 1000000 then return w + 1, 0 end
  return w, m
end
local function admit(h, seats, mark, A)
  if redis.call('EXISTS', mark) == 1 then return {-1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} end
  if redis.replicate_commands then redis.replicate_commands() end -- TIME before writes (Redis < 5)
  local clock = redis.call('TIME')
  local rnow = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  if rnow > tonumber(A[%[7]d]) then return {-2, rnow, 0, 0, 0, 0, 0, 0, 0, 0, 0} end
  local now = tonumber(A[1])
  local member = A[2]
  local exp = tonumber(A[3])
  local conc = tonumber(A[4])
  local rpm = tonumber(A[5])
  local tpm = tonumber(A[6])
  local need = tonumber(A[7])
  local est = tonumber(A[8])
  local dry = A[9] == '1'
  local ttl = tonumber(A[10])
  local fails = 0
  local rr, rt = 0, 0
  local function refill(f, cap)
    local v = redis.call('HMGET', h, f .. 'l', f .. 't')
    local lvl, t = tonumber(v[1]), tonumber(v[2])
    if lvl == nil or t == nil then return cap, now end
    if now > t then lvl = lvl + (now - t) * cap / 60000; t = now end
    if lvl > cap then lvl = cap end
    return lvl, t
  end
  if conc > 0 then
    redis.call('ZREMRANGEBYSCORE', seats, '-inf', now)
    if redis.call('ZCARD', seats) >= conc then fails = fails + 2^%[1]d end
  end
  local rl, rtm, tl, ttm
  if rpm > 0 then
    rl, rtm = refill('r', rpm)
    if rl < 1 then fails = fails + 2^%[2]d; rr = (1 - rl) * 60000 / rpm end
  end
  if tpm > 0 then
    tl, ttm = refill('t', tpm)
    if tl < need then fails = fails + 2^%[3]d; rt = (need - tl) * 60000 / tpm end
  end
  local wins = {}
  for p = 0, 3 do
    local i = 11 + p * 5
    if A[i] ~= '0' then
      local start, maxr, maxk, e, len = tonumber(A[i]), tonumber(A[i+1]), tonumber(A[i+2]), tonumber(A[i+3]), tonumber(A[i+4])
      local v = redis.call('HMGET', h, 'w' .. p .. 's', 'w' .. p .. 'r', 'w' .. p .. 'k')
      local r, k = 0, 0
      local stored = tonumber(v[1])
      -- the same window, or one a timezone change moved (window.holds)
      local nows = math.floor(now / 1000)
      if stored ~= nil and stored >= start + len then
        -- A later window already began (another router's clock, or its
        -- call, ran ahead): this late admission counts in it, and the
        -- window stays (writing its older start reset the new window).
        r = tonumber(v[2]) or 0; k = tonumber(v[3]) or 0; start = stored
      elseif stored ~= nil and (stored == start or (stored ~= 0 and 4 * (start - stored) < 3 * len and stored < start + len and nows < stored + len)) then
        r = tonumber(v[2]) or 0; k = tonumber(v[3]) or 0
      end
      if maxr > 0 and r + 1 > maxr then fails = fails + 2^(%[4]d + p) end
      if maxk > 0 and k + e > maxk then fails = fails + 2^(%[5]d + p) end
      wins[#wins + 1] = {p, start, r + 1, wincount(k + e)}
    end
  end
  if fails == 0 or dry then
    if conc > 0 then
      redis.call('ZADD', seats, exp, member)
      redis.call('PEXPIRE', seats, ttl)
    end
    if rpm > 0 then redis.call('HSET', h, 'rl', rl - 1, 'rt', rtm) end
    if tpm > 0 then redis.call('HSET', h, 'tl', tl - est, 'tt', ttm) end
    for _, w in ipairs(wins) do
      redis.call('HSET', h, 'w' .. w[1] .. 's', w[2], 'w' .. w[1] .. 'r', w[3], 'w' .. w[1] .. 'k', w[4])
    end
    redis.call('PEXPIRE', h, 3024000000)
    local st = {0, 0, 0, 0}
    for _, w in ipairs(wins) do st[w[1] + 1] = w[2] end
    redis.call('SET', mark, 'a ' .. table.concat(st, ' '), 'PX', %[6]d)
    if rpm > 0 then rl = rl - 1 end
    if tpm > 0 then tl = tl - est end
  end
  -- Bounded to what an integer reply holds (a bucket far below zero:
  -- maxWait); a level in whole units and millionths (a level in
  -- millionths alone, capped at -9e12, told a reset hours short).
  local rw, rm = level(rl)
  local tw, tm = level(tl)
  local out = {fails, math.ceil(math.min(rr, 4e15)), math.ceil(math.min(rt, 4e15)), rw, rm, tw, tm, 0, 0, 0, 0}
  for _, w in ipairs(wins) do out[8 + w[1]] = w[2] end
  return out
end
`, CodeConcurrencyUser, CodeRPM, CodeTPM, CodeQuotaRequests5h, CodeQuotaTokens5h, admitRecord.Milliseconds(), admitArgc)

// winCountLua writes a quota window's count of milli-tokens (a Lua
// number) as Redis stores an integer, bounded to [0, maxWindowCount]:
// Redis writes a Lua number of 1e17 or more with an exponent (1.2e+17),
// which HINCRBY refused ("hash value is not an integer"), so every
// settlement in that window failed from then on (a window without a token
// limit, whose requests with a huge max_tokens each reserve up to
// maxCount: about 90 of them in flight at once); and past 2^63 it would
// overflow. Past 2^53 the sums are not exact (a few milli-tokens, far past
// any limit).
var winCountLua = fmt.Sprintf(`
local function wincount(x)
  if x ~= x or x < 0 then x = 0 end
  if x > %[1]d then x = %[1]d end
  return string.format('%%.0f', x)
end
`, maxWindowCount)

// admitArgc is the number of the admission's arguments, admitRes of its
// results.
const (
	admitArgc = 11 + 5*numPeriods
	admitRes  = 7 + int(numPeriods)
)

// seatLua takes a seat on the first candidate with room: K are 3 keys
// per candidate (overall, prefill, decode), A now, expiry, member, parts
// mask, 3 limits, dry, ttl. It returns {candidate (1-based, 0: none),
// first full counter (1-based, 0: none), 1 if taken over the limit (dry
// run)}.
const seatLua = `
local function seat(K, A)
  local now = tonumber(A[1])
  local exp = tonumber(A[2])
  local member = A[3]
  local p = tonumber(A[4])
  local lim = {tonumber(A[5]), tonumber(A[6]), tonumber(A[7])}
  local dry = A[8] == '1'
  local ttl = tonumber(A[9])
  local need = {}
  for i = 1, 3 do if math.floor(p / 2^(i-1)) % 2 == 1 then need[#need + 1] = i end end
  local first, chosen = 0, 0
  for t = 0, #K / 3 - 1 do
    local ok = true
    for _, i in ipairs(need) do
      local k = K[t * 3 + i]
      redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
      if lim[i] > 0 and redis.call('ZCARD', k) >= lim[i] then
        ok = false
        if first == 0 then first = i end
        break
      end
    end
    if ok then chosen = t + 1; break end
  end
  local over = 0
  if chosen == 0 and dry then chosen = 1; over = 1 end
  if chosen > 0 then
    for _, i in ipairs(need) do
      local k = K[(chosen - 1) * 3 + i]
      redis.call('ZADD', k, exp, member)
      redis.call('PEXPIRE', k, ttl)
    end
  end
  return {chosen, first, over}
end
`

var (
	admitScript = redis.NewScript(admitLua + `return admit(KEYS[1], KEYS[2], KEYS[3], ARGV)`)
	// seatScript is a seat acquisition on its own: KEYS seatLua's, then
	// the call's mark; ARGV seatLua's, then its deadline (Unix ms,
	// callLife after it was made). A call that finds its mark set runs
	// after its return (undoSeat: its answer was lost, it was held in a
	// stalled connection or a proxy's buffer) and takes nothing: {-1, 0,
	// 0}. One that Redis reads past its deadline (by Redis's clock, TIME)
	// may run after its return's mark expired: it takes nothing and
	// returns {-2, Redis's time (ms), 0}.
	seatScript = redis.NewScript(seatLua + `
local K = {}
for i = 1, #KEYS - 1 do K[i] = KEYS[i] end
if redis.call('EXISTS', KEYS[#KEYS]) == 1 then return {-1, 0, 0} end
if redis.replicate_commands then redis.replicate_commands() end -- TIME before writes (Redis < 5)
local clock = redis.call('TIME')
local rnow = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if rnow > tonumber(ARGV[10]) then return {-2, rnow, 0} end
return seat(K, ARGV)
`)
	// admitSeatScript is a request's admission and its first seat in one
	// step (one round trip): KEYS the user's 3, then 3 per seat
	// candidate; ARGV the admission's admitArgc, then the seat's. The seat
	// is tried only when the admission passed (or in dry run). It returns
	// the admission's values, then the seat's 3 ({-1, 0, 0}: not tried).
	admitSeatScript = redis.NewScript(admitLua + seatLua + fmt.Sprintf(`
local A, S, K = {}, {}, {}
for i = 1, %[1]d do A[i] = ARGV[i] end
for i = %[1]d + 1, #ARGV do S[#S + 1] = ARGV[i] end
for i = 4, #KEYS do K[#K + 1] = KEYS[i] end
local r = admit(KEYS[1], KEYS[2], KEYS[3], A)
local q = {-1, 0, 0}
if #K > 0 and r[1] >= 0 and (r[1] == 0 or A[9] == '1') then q = seat(K, S) end
for i = 1, 3 do r[#r + 1] = q[i] end
return r
`, admitArgc))
)

// finishLua settles a ticket: K the user's hash, slot set and the
// ticket's mark, A member, conc, now, served, rpm cap (0: not taken), tpm
// cap (0: not taken), tpm delta, quota delta, channel, message, then per
// period: start (0: not taken), then the mark's TTL (ms). The mark (one
// key per ticket, named by its member) makes it idempotent: a settlement
// sent again after an ambiguous failure (a connection reset or a timeout:
// it may have run) finds it set ("1") and changes nothing, whichever copy
// Redis runs first.
//
// A settlement that finds no record (its admission's, admitLua) settles
// no counter, only the slot: the admission is not in this Redis. It was
// restarted without persistence (or lost the key to an eviction policy)
// since, and the windows and buckets it holds began afresh without the
// request: a refund or a reconciliation applied to them would take from
// requests admitted after the restart, below zero at worst. (Or the
// request outlived admitRecord: it keeps its estimate.)
//
// undo (endUnadmit) is the return of an admission whose answer was lost:
// its request was refused or admitted uncounted. The periods' starts are
// then the ones the admission recorded in the mark, and a mark without
// its record means the admission has not run (it finds the mark and takes
// nothing, admitLua) or took nothing: the counters stay as they are. Its
// slot and, in K after the mark with its member after the mark's TTL in
// A, its first seat (admitSeatScript) are removed either way.
const finishLua = `
local function finish(K, A, undo)
  local h = K[1]
  local m = redis.call('GET', K[3])
  if m == '1' then return end
  redis.call('SET', K[3], '1', 'PX', A[15])
  local starts = {A[11], A[12], A[13], A[14]}
  if not m then
    starts = nil
  elseif undo then
    local p = 0
    for s in string.gmatch(m, '%d+') do p = p + 1; starts[p] = s end
  end
  local now = tonumber(A[3])
  local served = A[4] == '1'
  local function adjust(f, cap, delta)
    local v = redis.call('HMGET', h, f .. 'l', f .. 't')
    local lvl, t = tonumber(v[1]), tonumber(v[2])
    if lvl == nil or t == nil then lvl = cap; t = now end
    if now > t then lvl = lvl + (now - t) * cap / 60000; t = now end
    lvl = lvl + delta
    if lvl > cap then lvl = cap end
    redis.call('HSET', h, f .. 'l', lvl, f .. 't', t)
  end
  if starts then
    local rpm = tonumber(A[5])
    if rpm > 0 and not served then adjust('r', rpm, 1) end
    local tpm = tonumber(A[6])
    if tpm > 0 then adjust('t', tpm, -tonumber(A[7])) end
    local qd = tonumber(A[8])
    for p = 0, 3 do
      local start = tonumber(starts[p + 1])
      if start ~= 0 and tonumber(redis.call('HGET', h, 'w' .. p .. 's')) == start then
        if not served then redis.call('HINCRBY', h, 'w' .. p .. 'r', -1) end
        if qd ~= 0 then
          local f = 'w' .. p .. 'k'
          redis.call('HSET', h, f, wincount((tonumber(redis.call('HGET', h, f)) or 0) + qd))
        end
      end
    end
  end
  if A[2] == '1' and redis.call('ZREM', K[2], A[1]) == 1 then
    redis.call('PUBLISH', A[9], A[10])
  end
  if undo and #K > 3 then
    local n = 0
    for i = 4, #K do n = n + redis.call('ZREM', K[i], A[16]) end
    if n > 0 then redis.call('PUBLISH', A[9], 'rl') end
  end
end
`

// releaseLua removes a member from the sets K and announces it: A member,
// channel, message. The return of a seat call whose answer was lost
// (undoSeat) has a fourth argument, its mark's TTL (ms), and the call's
// mark last in K: it sets the mark first (its first write: one refused
// there changed nothing), so that the call, should Redis run it later,
// finds it and takes nothing (seatScript).
const releaseLua = `
local function release(K, A)
  local n, last = 0, #K
  if A[4] then
    redis.call('SET', K[last], '1', 'PX', A[4])
    last = last - 1
  end
  for i = 1, last do n = n + redis.call('ZREM', K[i], A[1]) end
  if n > 0 then redis.call('PUBLISH', A[2], A[3]) end
end
`

// migrateLua copies a seat into the sets of another scope: K pairs of
// (a set it was taken in, the other scope's set), A member, expiry, ttl.
// A seat no longer in the first set of a pair (returned, or its lease
// expired) is not copied.
const migrateLua = `
local function migrate(K, A)
  for i = 1, #K, 2 do
    if redis.call('ZSCORE', K[i], A[1]) then
      redis.call('ZADD', K[i + 1], tonumber(A[2]), A[1])
      redis.call('PEXPIRE', K[i + 1], tonumber(A[3]))
    end
  end
end
`

// renewLua renews a slot's or a seat's lease in the sets K it holds: A
// member, expiry, ttl. It adds the member where it is missing: Redis lost
// it (restarted without persistence), or pruned it as expired after it
// was unreachable for longer than the lease TTL, while the request still
// runs. Only the router holding the member renews it, in order with its
// return (both are ends), so a returned member is never added back.
const renewLua = `
local function renew(K, A)
  for _, k in ipairs(K) do
    redis.call('ZADD', k, tonumber(A[2]), A[1])
    redis.call('PEXPIRE', k, tonumber(A[3]))
  end
end
`

// endsScript runs the ends of requests queued together (endKind), in
// order: ARGV holds their deadline (Unix ms, callLife after they were
// sent), then per end its kind, its number of keys and of arguments, then
// its arguments; KEYS its keys, end after end. Each end runs on its own
// (pcall): one that fails (an OOM write refused, a key of the wrong type)
// does not keep the others from running. It returns the number of ends
// that failed, the first error, and the positions (1-based) of the ends
// Redis refused (a write refused: READONLY on a replica, OOM under
// maxmemory), to send again: each end's first write comes before any
// other, so one refused there changed nothing, and one refused later (an
// OOM crossed between two writes) set its mark first (finishLua), which a
// copy finds.
//
// Past the deadline (Redis's clock, TIME: the copy was held in a
// connection or a proxy's buffer) a settlement (finish) may run after the
// mark of another copy expired: it only returns its slot (settleLate) and
// counts as failed. The other ends are safe late: a release removes
// nothing twice, a seat's copy to another scope's sets copies only a seat
// still held, an admission's return finds its mark or sets it, and a
// renewal adds back a member for one lease at most (LeaseTTL after it was
// made).
var endsScript = redis.NewScript(winCountLua + finishLua + releaseLua + migrateLua + renewLua + `
local function settleLate(K, A)
  if A[2] == '1' and redis.call('ZREM', K[2], A[1]) == 1 then
    redis.call('PUBLISH', A[9], A[10])
  end
end
local ki, ai = 1, 2
local failed, first = 0, ''
local refused, e = {}, 0
local late = false
if #ARGV > 1 then
  if redis.replicate_commands then redis.replicate_commands() end -- TIME before writes (Redis < 5)
  local clock = redis.call('TIME')
  late = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000) > tonumber(ARGV[1])
end
while ai <= #ARGV do
  local kind, nk, na = ARGV[ai], tonumber(ARGV[ai + 1]), tonumber(ARGV[ai + 2])
  ai = ai + 3
  local K, A = {}, {}
  for i = 0, nk - 1 do K[i + 1] = KEYS[ki + i] end
  for i = 0, na - 1 do A[i + 1] = ARGV[ai + i] end
  ki, ai = ki + nk, ai + na
  local ok, err
  local again = true
  e = e + 1
  if kind == 'f' and late then
    ok, err = pcall(settleLate, K, A)
    if ok then ok, err = false, 'a settlement ran past its deadline (its slot returned, its counters not): is this router\'s clock behind the state store\'s?' end
    again = false -- not sent again: a copy would be late too
  elseif kind == 'f' then ok, err = pcall(finish, K, A, false)
  elseif kind == 'u' then ok, err = pcall(finish, K, A, true)
  elseif kind == 'm' then ok, err = pcall(migrate, K, A)
  elseif kind == 'n' then ok, err = pcall(renew, K, A)
  else ok, err = pcall(release, K, A) end
  if not ok then
    failed = failed + 1
    if first == '' then first = tostring(type(err) == 'table' and (err.err or err[1]) or err) end
    if again then refused[#refused + 1] = e end
  end
end
return {failed, first, refused}
`)

// endKind names an end in endsScript.
type endKind string

const (
	endFinish  endKind = "f"
	endUnadmit endKind = "u" // an admission whose answer was lost, given back (finishLua's undo)
	endRelease endKind = "r"
	endMigrate endKind = "m" // a seat copied to another scope's sets (migrateLua)
	endRenew   endKind = "n" // a lease renewed (renewLua)
)

// allScripts are loaded at start and whenever Redis answers NOSCRIPT,
// endsScript first: a router that finds one of the others loaded finds
// it loaded too, so a batch's call never runs while its ends are refused.
var allScripts = []*redis.Script{endsScript, admitScript, seatScript, admitSeatScript, statusScript, keepScript, findScript, failScript, lockedScript}

// redisState keeps the counters in Redis.
//
// Script calls are sent one pipeline at a time: a call finding no
// pipeline out sends what is queued with it, from its own goroutine; calls
// queued while one is out go together in the next one, which the
// dispatcher (dispatch) sends. The ends of requests (a ticket's reconciliation,
// a seat given back) are queued without waiting: they ride in the batch of
// the next admission or seat acquisition, which Redis runs after them (a
// client's next request never finds its previous request's slot or seat
// taken, whichever connection carries it), or are sent alone after
// Options.EndDelay when no call comes. So a request costs one round trip:
// its admission and first seat, one script (admitSeatScript).
type redisState struct {
	g      *Governor
	c      *redis.Client
	prefix string
	wake   string // channel
	id     string // this router's id in lease members
	seq    atomic.Uint64
	ttl    time.Duration

	mu     sync.Mutex
	leases map[string][]string   // member -> keys it holds (heartbeat)
	seats  map[string]*seatState // member -> a seat held (followScopes)
	dirty  map[*userState]struct{}

	// The dispatcher's queue: calls and ends in order; waiting counts the
	// calls among them (someone waits for their answer).
	qmu     sync.Mutex
	q       []*scriptCall
	waiting int
	busy    bool // a pipeline is out
	closed  bool
	qwake   chan struct{}
	delay   time.Duration // EndDelay
	// redo holds returns of slots and seats to send again once Redis
	// answers a pipeline sent after them (qmu): a call that timed out
	// still runs when Redis reads it, possibly after its undo (sent on
	// another connection while Redis stalled), and a return that failed
	// (Redis down) left its member in Redis's sets. execs numbers the
	// pipelines sent. rets holds those among them that change no
	// counter, only a slot's or a seat's set (slotOnly), apart: a full
	// list loses those first (keep). keptBytes is about the memory both
	// hold (redoRelease.size).
	redo      []redoRelease
	rets      []redoRelease
	keptBytes int
	execs     atomic.Uint64
	// flushing: a call of flushRedo is out.
	flushing atomic.Bool
	// refusals counts the answers in a row in which Redis refused ends
	// (READONLY, OOM: refuseBackoff), and holdRedo is the time (Unix ns)
	// before which what is kept in redo is not sent again (0: no hold).
	// Only exec writes them (one pipeline at a time).
	refusals atomic.Int32
	holdRedo atomic.Int64
	// stalled is the time (Unix ns) until which a call fails at once,
	// 0 while Redis answers (mayCall).
	stalled atomic.Int64
	// settleFor is settleResend, maxRedo and maxRedoBytes the bounds of
	// redo, callLife the constant callLife (tests shorten them before any
	// call).
	settleFor    time.Duration
	maxRedo      int
	maxRedoBytes int
	callLife     time.Duration
	// probed, when set (tests, before any call), is told how long each
	// pipeline sent as a stall's probe took (exec), whoever sent it.
	probed func(time.Duration)

	kick chan struct{}
	ps   *redis.PubSub
	log  logx.Throttle
}

// scriptCall is one script run, or one end, in a batch.
type scriptCall struct {
	s    *redis.Script // nil: an end of kind end, run by endsScript
	end  endKind
	keys []string
	args []any
	cmd  *redis.Cmd
	done chan *redis.Cmd // nil: an end (nobody waits)
	// parts are the ends an endsScript call runs (exec).
	parts []*scriptCall
	// until: an end sent again (redo) is dropped after it (zero: never).
	until time.Time
	probe bool // sent in a stall (mayCall)
}

// stalledCmd is the answer of a call failed at once in a stall.
func stalledCmd() *redis.Cmd {
	mStateStalled.Inc()
	cmd := redis.NewCmd(context.Background())
	cmd.SetErr(errStateStalled)
	return cmd
}

// redoRelease is a return (releaseLua) to send again after the pipeline
// numbered after sends an answered one.
type redoRelease struct {
	keys  []string
	args  []any
	after uint64
	// ended: the return of an end that failed, whose slot or seat was
	// taken for sure (its call was answered). It goes out at the head of
	// the next pipeline, before that pipeline's admissions: Redis back
	// from its AOF would hold the slot against them otherwise.
	ended bool
	// renewal: the return of a member whose renewal failed (renewLua; it
	// may run late, in a stall, after the member's return): sent again
	// only if the member is no longer held by then.
	renewal bool
	// kind is the end to send: endRelease (releaseLua) unless it is a
	// whole reconciliation (endFinish, a settlement).
	kind endKind
	// size is about the bytes x holds (keep).
	size int
	// until is when a settlement that may have run stops being sent
	// again (settleResend after its first ambiguous failure): past it, its
	// mark may have expired in Redis, and a copy that runs would count it
	// twice. Zero: no copy may have run.
	until time.Time
}

// A settlement's mark (finishLua) lives settleMark in Redis (about 130
// bytes each, one per request: 16 MB at 1,000 requests/s); a settlement
// whose sending failed ambiguously (it may have run) is sent again until
// it lands, for up to settleResend after that failure, so that any copy
// of it that runs finds the mark of the copy that ran before. Each copy
// carries a deadline, callLife after it was sent (endsScript): the last is
// sent at most settleResend plus a call's timeout (2 s) after the first
// that may have run, so every copy that counts runs within about 92 s of
// it, inside its mark's settleMark, while the router's clock runs at most
// 28 s ahead of Redis's.
const (
	settleMark   = 2 * time.Minute
	settleResend = settleMark / 2
)

// admitRecord is how long an admission's record (the "a" mark, admitLua)
// lives in Redis: until its request's settlement replaces it with the
// settled mark, or its return (endUnadmit) does. The return of an
// admission whose answer was lost is sent until it lands, however late
// (Redis unreachable for long), and gives back only the slot and the seat
// once the record is gone: the record must outlive it. It lived
// settleMark (2 minutes) before, so a return that landed later left the
// refused request's quota and bucket charges for good. A record costs
// about 200 bytes for the life of its request (24 h at most, the
// requests of a router that died before settling them included).
const admitRecord = 24 * time.Hour

// callLife bounds how late Redis may run an admission, a seat call
// (seatScript) or a settlement: each carries a deadline, callLife after
// the router made or sent it (the router's clock), and one that Redis
// reads past it (Redis's clock, TIME: a call held in a stalled
// connection, a proxy's buffer, a TCP retransmission) takes nothing
// (admitLua, seatScript) or changes no counter (endsScript). An admission's return, should its answer be lost, sets the
// ticket's mark for settleMark from when it runs, after the admission was
// made, so an admission that runs after its return finds the mark as long
// as callLife plus the router's clock's lead on Redis's stays below
// settleMark: exact for a lead up to 90 s (28 s for settlements, above).
// A router's clock more than callLife behind Redis's has every admission
// refused as late (an error: on_state_error decides) and its settlements'
// counters left as they are.
const callLife = 30 * time.Second

// maxRedoBytes bounds the memory of the ends kept for sending again (Redis
// down, or refusing writes, for long under load), and maxRedo their
// number: an end costs by what it holds (sizeOf: its keys and arguments,
// about 670 bytes for a settlement, 370 for a seat's return), so 16 MiB
// keep about 25,000 settlements (16,384 ends of any kind before). Past
// either one goes, the one whose loss costs least: the oldest end that
// only returns a slot or a seat (rets: a return, or a settlement that
// changes no counter, slotOnly), whose member frees itself when its
// lease runs out (LeaseTTL after its return at most: its last renewal
// came before it; the oldest is the likeliest to have run out already),
// counted in
// infera_governance_state_releases_dropped_total{reason="evicted"}; only
// when none is kept, the oldest settlement (a request's, or an
// admission's return), whose request keeps its estimate charged (a
// refunded one its request count) for good, counted in
// infera_governance_state_settlements_dropped_total{reason="evicted"}
// (and in the releases' when it held a slot or a seat). Settlements are
// not merged to take less room: each one's mark in Redis (finishLua) is
// what makes a copy that may have run count once, and its admission's
// record there what keeps it from settling counters a Redis restarted
// without persistence began afresh, both per request.
const (
	maxRedoBytes = 16 << 20
	maxRedo      = 1 << 17
)

// sizeOf is about the bytes x holds in redo: the struct, its keys and
// arguments (16 bytes each in their slices, and their strings' bytes, or
// 8 for a number boxed in an interface).
func (x *redoRelease) sizeOf() int {
	n := int(unsafe.Sizeof(*x)) + 16*(len(x.keys)+len(x.args))
	for _, k := range x.keys {
		n += len(k)
	}
	for _, a := range x.args {
		if s, ok := a.(string); ok {
			n += 16 + len(s)
		} else {
			n += 8
		}
	}
	return n
}

// keepRedo keeps a return to send again once Redis answers (redo).
func (r *redisState) keepRedo(keys []string, args []any, ended bool) {
	r.keep(redoRelease{keys: keys, args: args, ended: ended})
}

func (r *redisState) keep(x redoRelease) {
	x.after = r.execs.Load()
	x.size = x.sizeOf()
	var evicted []redoRelease
	r.qmu.Lock()
	if x.slotOnly() {
		r.rets = append(r.rets, x)
	} else {
		r.redo = append(r.redo, x)
	}
	r.keptBytes += x.size
	for r.keptLocked() > r.maxRedo || r.keptBytes > r.maxRedoBytes {
		evicted = append(evicted, r.evictLocked())
	}
	r.qmu.Unlock()
	for i := range evicted {
		r.evicted(&evicted[i])
	}
}

// evictLocked takes the end to lose from a full list: the oldest that
// only returns a slot or a seat, else the oldest. qmu must be held.
func (r *redisState) evictLocked() redoRelease {
	q := &r.redo
	if len(r.rets) > 0 {
		q = &r.rets
	}
	out := (*q)[0]
	(*q)[0] = redoRelease{}
	*q = (*q)[1:]
	r.keptBytes -= out.size
	return out
}

// evicted counts out, an end evicted from a full list.
func (r *redisState) evicted(out *redoRelease) {
	if k := out.kind; (k == endFinish || k == endUnadmit) && !out.slotOnly() {
		mStateSettleEvicted.Inc()
	}
	if r.renewalHeld(out) {
		// The return of a member whose renewal may run late: lost only
		// if the member was returned meanwhile (r.mu after r.qmu: never
		// both held).
		return
	}
	if out.releases() {
		mStateReleaseEvicted.Inc()
	}
}

// slotOnly reports whether x changes no counter in Redis, only (at most)
// a slot's or a seat's set: a return (endRelease), or a settlement that
// refunds no request (its request was served, or took no RPM token and
// counted in no quota window) and corrects no token count (its usage was
// its estimate, or its TPM bucket and quota windows are off): what a
// user with only a concurrency limit settles. Lost, it leaves at most a
// member that expires with its lease (rets).
func (x *redoRelease) slotOnly() bool {
	switch x.end() {
	case endRelease:
		return true
	case endFinish:
	default:
		return false
	}
	// finishLua's arguments: member, conc, now, served, rpm cap, tpm cap,
	// tpm delta, quota delta, channel, message, the periods' starts.
	a := x.args
	if len(a) < 10+int(numPeriods) {
		return false
	}
	windows := false
	for _, v := range a[10 : 10+numPeriods] {
		windows = windows || argInt(v) != 0
	}
	served := argInt(a[3]) == 1
	refunds := !served && (argInt(a[4]) != 0 || windows)
	corrects := argInt(a[5]) != 0 && argInt(a[6]) != 0 || windows && argInt(a[7]) != 0
	return !refunds && !corrects
}

// argInt is a script's integer argument (int or int64); anything else
// is taken for a nonzero value.
func argInt(v any) int64 {
	switch n := v.(type) {
	case int:
		return int64(n)
	case int64:
		return n
	}
	return 1
}

// keptLocked is the number of ends kept for sending again. qmu must be
// held.
func (r *redisState) keptLocked() int { return len(r.redo) + len(r.rets) }

// takeKept takes every end kept for sending again, those that only
// return a slot or a seat first. qmu must be held.
func (r *redisState) takeKept() []redoRelease {
	kept := append(r.rets, r.redo...)
	r.rets, r.redo, r.keptBytes = nil, nil, 0
	return kept
}

// While Redis refuses ends as they run (READONLY from a primary a
// failover demoted, OOM under maxmemory with noeviction) or answers their
// whole call with an error (LOADING its AOF or dump after a restart, BUSY
// behind a long script: sent again at every poll before), what is kept in
// redo is sent again after a backoff that doubles with each answer that
// refuses ends, from refuseBackoff up to maxRefuseBackoff, each step drawn
// in its upper half (jitter: routers refused together do not come back
// together), instead of ahead of every pipeline and at every poll: a
// Redis in trouble is not hammered (a refused end was sent again after
// every answered pipeline, ends-only pipelines included: one router sent
// a refused settlement 52,851 to 65,036 times in 2 s in
// TestRedisEndsRedisKeepsRefusingAreSentAgainWithBackoff). The first
// answer that lands an end other than a release (which OOM does not
// refuse) ends it. The cap stays well below settleResend, so a settlement
// that may have run is still sent again several times before it is
// dropped.
const (
	refuseBackoff    = 200 * time.Millisecond
	maxRefuseBackoff = 5 * time.Second
)

// refused notes an answer in which Redis refused ends: what redo keeps
// waits for the next step of the backoff.
func (r *redisState) refused() {
	n := min(r.refusals.Add(1), 16)
	d := min(refuseBackoff<<(n-1), maxRefuseBackoff)
	d = d/2 + mrand.N(d/2+1)
	r.holdRedo.Store(time.Now().Add(d).UnixNano())
}

// wrote notes an answer in which Redis took ends: the backoff is over.
func (r *redisState) wrote() {
	if r.refusals.Load() != 0 {
		r.refusals.Store(0)
		r.holdRedo.Store(0)
	}
}

// redoHeld reports whether what redo keeps waits for the backoff.
func (r *redisState) redoHeld() bool {
	hold := r.holdRedo.Load()
	return hold != 0 && time.Now().UnixNano() < hold
}

// maxRedoAhead bounds the ended returns that go ahead of one pipeline's
// calls (the rest follow once it is answered, resendRedo).
const maxRedoAhead = 1024

// takeEndedRedo takes the ended returns kept (up to maxRedoAhead) as ends
// to send ahead of a pipeline's calls. Sending one early is safe: its
// slot or seat was taken, and a return removes nothing twice.
func (r *redisState) takeEndedRedo() []*scriptCall {
	if r.redoHeld() {
		return nil
	}
	r.qmu.Lock()
	defer r.qmu.Unlock()
	var out []*scriptCall
	now := time.Now()
	take := func(kept []redoRelease) []redoRelease {
		keep := kept[:0]
		for _, x := range kept {
			if x.expired(now) {
				r.keptBytes -= x.size
				continue
			}
			if x.ended && len(out) < maxRedoAhead {
				r.keptBytes -= x.size
				out = append(out, &scriptCall{end: x.end(), keys: x.keys, args: x.args, until: x.until})
			} else {
				keep = append(keep, x)
			}
		}
		clear(kept[len(keep):])
		return keep
	}
	r.rets = take(r.rets)
	r.redo = take(r.redo)
	return out
}

// takeAllRedo takes every return kept for sending again, as ends, when
// the router closes: those of ended requests, those waiting for a later
// pipeline's answer (a call that timed out may still run after them, but
// none would go later), and the returns of renewals whose member is no
// longer held.
func (r *redisState) takeAllRedo() []*scriptCall {
	r.qmu.Lock()
	kept := r.takeKept()
	r.qmu.Unlock()
	now := time.Now()
	var out []*scriptCall
	for i := range kept {
		x := &kept[i]
		if x.expired(now) {
			continue
		}
		if r.renewalHeld(x) {
			continue
		}
		out = append(out, &scriptCall{end: x.end(), keys: x.keys, args: x.args, until: x.until})
	}
	return out
}

// renewalHeld reports whether x is the return of a renewal whose member
// this router still holds. It takes r.mu: the caller holds not r.qmu.
func (r *redisState) renewalHeld(x *redoRelease) bool {
	if !x.renewal {
		return false
	}
	r.mu.Lock()
	_, held := r.leases[x.args[0].(string)]
	r.mu.Unlock()
	return held
}

// redoLen is the number of returns kept for sending again.
func (r *redisState) redoLen() int {
	r.qmu.Lock()
	defer r.qmu.Unlock()
	return r.keptLocked()
}

// dropRedo counts what is still kept for sending again as the router
// closes (its last pipeline failed): never sent.
func (r *redisState) dropRedo() {
	r.qmu.Lock()
	kept := r.takeKept()
	r.qmu.Unlock()
	for i := range kept {
		droppedAtClose(&kept[i])
	}
}

// droppedAtClose counts x, an end the router closed without sending.
func droppedAtClose(x *redoRelease) {
	if k := x.kind; k == endFinish || k == endUnadmit {
		mStateSettleClosed.Inc()
	}
	if x.releases() {
		mStateReleaseClosed.Inc()
	}
}

// expired reports whether x is a settlement past its time to be sent
// again (until), and counts it.
func (x *redoRelease) expired(now time.Time) bool {
	if x.until.IsZero() || now.Before(x.until) {
		return false
	}
	mStateSettleExpired.Inc()
	if x.releases() {
		mStateReleaseExpired.Inc()
	}
	return true
}

// releases reports whether x gives back a concurrency slot or a seat: a
// release (of a seat, of a member whose renewal or call failed), or a
// settlement or an admission's return whose request held a slot (its
// second argument, finishLua) or, for an admission's return, a seat (keys
// after the mark). Dropped, it leaves that slot or seat taken in Redis
// until its lease expires.
func (x *redoRelease) releases() bool {
	switch x.end() {
	case endRelease:
		return true
	case endFinish, endUnadmit:
		return len(x.args) > 1 && x.args[1] == 1 || x.kind == endUnadmit && len(x.keys) > 3
	}
	return false
}

// end is the kind of end x sends.
func (x *redoRelease) end() endKind {
	if x.kind == "" {
		return endRelease
	}
	return x.kind
}

// keepFailedEnds keeps for sending again the returns of the ends of an
// endsScript call that failed: a return as it is; a finish (a
// settlement) whole, tokens and slot, whether it may have run or not: its
// mark makes it count once (finishLua). unsent: they did not run (the
// call could not connect; or Redis answered it with an error reply for the
// whole script, LOADING while it loads its AOF or dump after a restart,
// BUSY, since each end runs under pcall and no error raised while they
// run fails the script; or it refused them as they ran, READONLY, OOM).
func (r *redisState) keepFailedEnds(parts []*scriptCall, unsent bool) {
	for _, x := range parts {
		switch x.end {
		case endRelease:
			r.keepRedo(x.keys, x.args, true)
		case endUnadmit:
			// The return of an admission whose answer was lost: every
			// copy is safe (it finds the mark, or the admission's record
			// gone with it), so it is sent until it lands.
			r.keep(redoRelease{keys: x.keys, args: x.args, ended: true, kind: endUnadmit})
		case endFinish:
			// The request's refund or reconciliation (its request count,
			// RPM token, token estimate) and its slot, once Redis answers
			// (ahead of the next pipeline's admissions): a Redis back
			// with its data (a partition, a restart from its AOF) would
			// keep the estimate charged for good otherwise, and a
			// settlement cut off by a connection reset would be lost
			// for every router (or, sent again without its mark, counted
			// twice when it had run).
			until := x.until
			if !unsent && until.IsZero() { // the first copy that may have run
				until = time.Now().Add(r.settleFor)
			}
			r.keep(redoRelease{keys: x.keys, args: x.args, ended: true, kind: endFinish, until: until})
		case endRenew:
			// It may still run (a timeout), after the member's return;
			// one never sent keeps nothing (every renewal of a long
			// outage would fill redo and evict the returns of ends).
			if !unsent {
				r.keep(redoRelease{keys: x.keys, args: []any{x.args[0], r.wake, r.wakeMessage(x.keys[0])}, renewal: true})
			}
		}
	}
}

// resendRedo queues again the returns kept before pipeline n, which
// Redis answered (they then run after whatever Redis read before it).
func (r *redisState) resendRedo(n uint64) {
	if r.redoHeld() {
		return // sent once the backoff's step is over (flushRedo, or ahead of a pipeline)
	}
	r.qmu.Lock()
	var again []redoRelease
	take := func(kept []redoRelease) []redoRelease {
		keep := kept[:0]
		for _, x := range kept {
			if x.after < n {
				again = append(again, x)
				r.keptBytes -= x.size
			} else {
				keep = append(keep, x)
			}
		}
		clear(kept[len(keep):])
		return keep
	}
	r.rets = take(r.rets)
	r.redo = take(r.redo)
	r.qmu.Unlock()
	now := time.Now()
	for _, x := range again {
		if x.expired(now) {
			continue
		}
		if x.renewal {
			r.mu.Lock()
			_, held := r.leases[x.args[0].(string)]
			r.mu.Unlock()
			if held {
				continue // renewed again by the next heartbeat, returned by its end
			}
		}
		mStateUndone.Inc()
		r.endUntil(x.end(), x.keys, x.args, x.until)
	}
}

// notSent reports whether err is a call's failure to connect to Redis: it
// never reached Redis, so sending it again counts nothing twice.
func notSent(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// wakeMessage is the release notification of a member of set k: the
// user's ("u:<user>") for a user's slot set, the seats' ("rl") else.
func (r *redisState) wakeMessage(k string) string {
	if u, ok := strings.CutPrefix(k, r.prefix+"{u:"); ok {
		if name, ok := strings.CutSuffix(u, "}:seats"); ok {
			return "u:" + name
		}
	}
	return "rl"
}

var errStateClosed = errors.New("the governance is closed")

// errStateStalled fails a call at once while Redis is stalled (mayCall).
var errStateStalled = errors.New("the state store timed out a moment ago (stalled): not waiting on it again yet")

// After a pipeline timed out (Redis stalled: a fork on a large dataset, a
// long script, a network partition without a reset), calls fail at once
// for stallHold, and on_state_error decides, instead of each request
// waiting out its own timeout behind the stalled pipeline. Then one call
// goes through as a probe, the others still failing at once for up to
// probeWindow: an answered pipeline ends the stall, another timeout
// starts a new hold.
const (
	stallHold   = time.Second
	probeWindow = 3 * time.Second
)

// mayCall reports whether a call may be sent now (see stallHold), and
// whether it goes as the stall's probe.
func (r *redisState) mayCall() (ok, probe bool) {
	until := r.stalled.Load()
	if until == 0 {
		return true, false
	}
	now := time.Now().UnixNano()
	if now < until {
		return false, false
	}
	ok = r.stalled.CompareAndSwap(until, now+int64(probeWindow))
	return ok, ok
}

// isTimeout reports whether err is a call that timed out.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// callTimeout bounds one call to Redis (the client's read timeout).
const callTimeout = time.Second

func newRedisState(g *Governor, o Options) (*redisState, error) {
	ro, err := redis.ParseURL(o.State)
	if err != nil {
		return nil, fmt.Errorf("cannot parse --state: %w", logx.StripURL(err)) // url.Parse's errors quote the URL, password included
	}
	ro.DialTimeout = time.Second
	ro.ReadTimeout = callTimeout
	ro.WriteTimeout = time.Second
	// No retries: go-redis resends a whole pipeline after a read timeout,
	// which Redis has usually run already (admissions and ends counted
	// twice). A failed call is on_state_error's to decide.
	ro.MaxRetries = -1
	// One dial per connection (go-redis tries 5, 100 ms apart): a Redis
	// that is down fails a call at once, and on_state_error decides,
	// instead of every request waiting out the retries.
	ro.DialerRetries = 1
	ro.DisableIdentity = true
	// Pipelines on the main pool: go-redis's dedicated pipeline pool, when
	// a new connection's handshake (HELLO) times out, dials another on the
	// main pool and waits for its handshake too, so a call on a new
	// connection to a stalled Redis waited two read timeouts.
	ro.PipelinePoolSize = -1
	ro.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	var rid [6]byte
	if _, err := rand.Read(rid[:]); err != nil {
		return nil, err
	}
	r := &redisState{
		g:            g,
		c:            redis.NewClient(ro),
		prefix:       o.RedisPrefix,
		wake:         o.RedisPrefix + "wake",
		id:           hex.EncodeToString(rid[:]),
		ttl:          o.LeaseTTL,
		leases:       map[string][]string{},
		seats:        map[string]*seatState{},
		dirty:        map[*userState]struct{}{},
		qwake:        make(chan struct{}, 1),
		delay:        o.EndDelay,
		settleFor:    settleResend,
		maxRedo:      maxRedo,
		maxRedoBytes: maxRedoBytes,
		callLife:     callLife,
		kick:         make(chan struct{}, 1),
		log:          logx.Throttle{Every: 10 * time.Second},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for _, s := range allScripts {
		if err := s.Load(ctx, r.c).Err(); err != nil {
			r.c.Close()
			return nil, fmt.Errorf("cannot reach the state store at %s: %w", ro.Addr, err)
		}
	}
	r.ps = r.c.Subscribe(context.Background(), r.wake)
	g.wg.Add(3)
	go r.loop()
	go r.listen()
	go r.dispatch()
	return r, nil
}

func (r *redisState) close() error {
	r.ps.Close()
	return r.c.Close()
}

// call runs s and waits for its answer: in a pipeline of its own with
// what is queued when no pipeline is out (sent from this goroutine: no
// hand-off), else in the next batch.
func (r *redisState) call(s *redis.Script, keys []string, args ...any) *redis.Cmd {
	ok, probe := r.mayCall()
	if !ok {
		return stalledCmd()
	}
	c := &scriptCall{s: s, keys: keys, args: args, done: make(chan *redis.Cmd, 1), probe: probe}
	r.qmu.Lock()
	if r.closed {
		r.qmu.Unlock()
		cmd := redis.NewCmd(context.Background())
		cmd.SetErr(errStateClosed)
		return cmd
	}
	r.q = append(r.q, c)
	r.waiting++
	if r.busy {
		r.qmu.Unlock() // the sender out hands the queue to the dispatcher when done
		return <-c.done
	}
	batch := r.takeLocked()
	r.qmu.Unlock()
	r.send(batch, false)
	return <-c.done
}

// end queues an end of a request without waiting for it: it runs before
// any call queued after it. Ends queued together run in one endsScript.
func (r *redisState) end(kind endKind, keys []string, args []any) {
	r.endUntil(kind, keys, args, time.Time{})
}

// endUntil is end for an end sent again that is dropped after until
// (redoRelease.until; zero: never).
func (r *redisState) endUntil(kind endKind, keys []string, args []any, until time.Time) {
	r.qmu.Lock()
	if r.closed {
		r.qmu.Unlock()
		// A request that ended after the router closed (or a return
		// sent again once its last pipeline was answered).
		droppedAtClose(&redoRelease{kind: kind, keys: keys, args: args})
		return
	}
	r.q = append(r.q, &scriptCall{end: kind, keys: keys, args: args, until: until})
	busy := r.busy
	r.qmu.Unlock()
	if !busy {
		r.wakeDispatch() // to send it alone after EndDelay unless a call carries it
	}
}

// takeLocked takes the queue as the next batch and marks a pipeline out.
func (r *redisState) takeLocked() []*scriptCall {
	batch := r.q
	r.q, r.waiting, r.busy = nil, 0, true
	return batch
}

// send sends batch, then hands what was queued meanwhile to the
// dispatcher. probe: batch goes as a stall's probe (exec).
func (r *redisState) send(batch []*scriptCall, probe bool) {
	r.exec(batch, probe)
	r.qmu.Lock()
	r.busy = false
	more := len(r.q) > 0
	r.qmu.Unlock()
	if more {
		r.wakeDispatch()
	}
}

func (r *redisState) wakeDispatch() { nudge(r.qwake) }

// dispatch sends what callers left queued (calls queued while a pipeline
// was out; ends no call carried within EndDelay), one pipeline at a time,
// until the Governor closes; then it sends what is left and refuses new
// calls.
func (r *redisState) dispatch() {
	defer r.g.wg.Done()
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	lingering, force := false, false
	for {
		select {
		case <-r.g.stop:
			r.qmu.Lock()
			r.closed = true
			r.qmu.Unlock()
			for {
				r.qmu.Lock()
				if !r.busy {
					batch := r.takeLocked()
					r.qmu.Unlock()
					// What is kept to send again goes now, ahead: nothing
					// would carry it later (maxRedoAhead per pipeline).
					kept := r.takeAllRedo()
					n := min(len(kept), maxRedoAhead)
					if batch = append(kept[:n:n], batch...); len(batch) > 0 {
						r.exec(batch, true)
					}
					// The rest, while Redis takes them (a failure is kept
					// in redo, and the rest goes with it).
					for kept = kept[n:]; len(kept) > 0 && r.redoLen() == 0; kept = kept[n:] {
						n = min(len(kept), maxRedoAhead)
						r.exec(kept[:n:n], true)
					}
					for _, c := range kept {
						droppedAtClose(&redoRelease{kind: c.end, keys: c.keys, args: c.args})
					}
					r.dropRedo()
					return
				}
				r.qmu.Unlock()
				time.Sleep(time.Millisecond) // a caller's pipeline is out
			}
		case <-r.qwake:
		case <-linger.C:
			lingering, force = false, true
		}
		r.qmu.Lock()
		switch {
		case r.busy || len(r.q) == 0:
			// A sender is out (it wakes this loop when done), or nothing to do.
			force = force && len(r.q) > 0
			r.qmu.Unlock()
		case r.waiting == 0 && r.stalled.Load() != 0:
			// Only ends while Redis stalls: sent now, they would hold the
			// pipeline out for a timeout, and the stall's probe would wait
			// behind them. A probe carries them, or, once the hold is over
			// and no call came, they go as the probe themselves.
			r.qmu.Unlock()
			if ok, _ := r.mayCall(); ok {
				r.qmu.Lock()
				if r.busy || len(r.q) == 0 {
					r.qmu.Unlock()
					continue
				}
				batch := r.takeLocked()
				r.qmu.Unlock()
				if lingering {
					linger.Stop()
					lingering = false
				}
				force = false
				r.send(batch, true)
				continue
			}
			if lingering {
				linger.Stop()
			}
			linger.Reset(max(time.Until(time.Unix(0, r.stalled.Load())), time.Millisecond))
			lingering, force = true, false
		case r.waiting == 0 && !force && r.delay > 0:
			// Only ends: wait a little for a call to carry them.
			r.qmu.Unlock()
			if !lingering {
				linger.Reset(r.delay)
				lingering = true
			}
		default:
			batch := r.takeLocked()
			r.qmu.Unlock()
			if lingering {
				linger.Stop()
				lingering = false
			}
			force = false
			r.send(batch, false)
		}
	}
}

// exec sends batch as one pipeline and hands out the answers; ends queued
// next to each other go as one endsScript. A batch that finds Redis
// without the scripts (restarted) loads them and is sent again (a script
// refused with NOSCRIPT did not run). While Redis stalls, a batch's calls
// fail at once but the stall's probe, and its ends wait for the probe
// unless they are it (probe).
func (r *redisState) exec(batch []*scriptCall, probe bool) {
	if until := r.stalled.Load(); until != 0 && time.Now().UnixNano() < until {
		// Calls queued behind the pipeline that timed out fail at once
		// too.
		kept := batch[:0]
		for _, c := range batch {
			if c.done != nil && !c.probe {
				c.done <- stalledCmd()
				continue
			}
			probe = probe || c.probe
			kept = append(kept, c)
		}
		if batch = kept; len(batch) == 0 {
			return
		}
		if !probe {
			// Only ends: they wait for the stall's probe (dispatch), ahead
			// of what was queued meanwhile.
			r.qmu.Lock()
			if !r.closed {
				r.q = append(batch, r.q...)
				r.qmu.Unlock()
				return
			}
			r.qmu.Unlock()
		}
	}
	if ahead := r.takeEndedRedo(); len(ahead) > 0 {
		mStateUndone.Add(len(ahead))
		batch = append(ahead, batch...)
	}
	var probeStart time.Time
	if probe && r.probed != nil {
		probeStart = time.Now()
	}
	ctx, cancel := r.ctx()
	defer cancel()
	wire := make([]*scriptCall, 0, len(batch))
	for i := 0; i < len(batch); {
		c := batch[i]
		if c.s != nil {
			wire = append(wire, c)
			i++
			continue
		}
		e := &scriptCall{s: endsScript}
		// The real clock's, not Options.Now's: it bounds the copy's
		// time in transit, by Redis's clock (callLife).
		e.args = append(e.args, time.Now().Add(r.callLife).UnixMilli())
		for ; i < len(batch) && batch[i].s == nil; i++ {
			x := batch[i]
			if !x.until.IsZero() && !time.Now().Before(x.until) {
				// A settlement sent again that waited past its time in the
				// queue (a stall's hold): dropped as in redo.
				(&redoRelease{kind: x.end, args: x.args, keys: x.keys, until: x.until}).expired(time.Now())
				continue
			}
			e.keys = append(e.keys, x.keys...)
			e.args = append(e.args, string(x.end), len(x.keys), len(x.args))
			e.args = append(e.args, x.args...)
			e.parts = append(e.parts, x)
		}
		wire = append(wire, e)
	}
	n := r.execs.Add(1)
	send := func(cs []*scriptCall) {
		mStateRoundTrips.Inc()
		p := r.c.Pipeline()
		for _, c := range cs {
			c.cmd = c.s.EvalSha(ctx, p, c.keys, c.args...)
		}
		_, _ = p.Exec(ctx) // each call's error is in its cmd
	}
	send(wire)
	var again []*scriptCall
	for _, c := range wire {
		if err := c.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, c)
		}
	}
	if len(again) > 0 {
		for _, s := range allScripts {
			s.Load(ctx, r.c)
		}
		send(again)
	}
	answered, timedOut := true, false
	refusedEnds, wroteEnds := false, false
	for _, c := range wire {
		if err := c.cmd.Err(); err != nil && !isScriptError(err) {
			timedOut = timedOut || isTimeout(err)
		}
		if c.done != nil {
			if c.cmd.Err() != nil && !isScriptError(c.cmd.Err()) {
				answered = false
			}
			c.done <- c.cmd
			continue
		}
		res, err := c.cmd.Slice()
		if err != nil {
			answered = false
			r.keepFailedEnds(c.parts, notSent(err) || isScriptError(err))
			// An error reply for the whole call (LOADING, BUSY) refused
			// them all: the same backoff.
			refusedEnds = refusedEnds || isScriptError(err) && len(c.parts) > 0
		}
		if err == nil && len(res) == 3 {
			if n, _ := res[0].(int64); n > 0 {
				err = fmt.Errorf("%d of the batch's ends failed: %v", n, res[1])
			}
			// The ends Redis refused changed nothing: sent again, after
			// the backoff's next step.
			pos, _ := res[2].([]any)
			var again []*scriptCall
			for _, p := range pos {
				if i, ok := p.(int64); ok && i >= 1 && int(i) <= len(c.parts) {
					again = append(again, c.parts[i-1])
				}
			}
			r.keepFailedEnds(again, true)
			switch {
			case len(again) > 0:
				refusedEnds = true
			case slices.ContainsFunc(c.parts, func(x *scriptCall) bool { return x.end != endRelease }):
				wroteEnds = true
			}
		}
		if err != nil {
			r.failed("end", err, true)
		}
	}
	switch {
	case refusedEnds:
		r.refused()
	case wroteEnds:
		r.wrote()
	}
	switch {
	case answered:
		r.stalled.Store(0)
		r.resendRedo(n)
	case timedOut:
		r.stalled.Store(time.Now().Add(stallHold).UnixNano())
	}
	if !probeStart.IsZero() {
		r.probed(time.Since(probeStart))
	}
}

// refusedWrite reports whether err is Redis refusing a script's first
// write (READONLY on a replica; OOM, which Redis raises only before a
// script's first write: scriptVerifyOOM in Redis's script.c checks
// SCRIPT_WRITE_DIRTY): the script changed nothing, and Redis answered
// it, so it does not run later. A call refused so keeps no return: under
// a lasting refusal every admission's would fill redo.
func refusedWrite(err error) bool {
	return redis.HasErrorPrefix(err, "READONLY") || redis.HasErrorPrefix(err, "OOM")
}

// isScriptError reports whether err is Redis's answer (a script's error),
// not a failure to reach it.
func isScriptError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

func (r *redisState) member() string {
	return r.id + ":" + strconv.FormatUint(r.seq.Add(1), 36)
}

// userKeys are the Redis keys of the counters of the user named name.
func (r *redisState) userKeys(name string) (string, string) {
	h := r.prefix + "{u:" + name + "}"
	return h, h + ":seats"
}

// failed records a state store error and reports whether to admit (open).
func (r *redisState) failed(op string, err error, open bool) bool {
	mStateErrors.Inc()
	if op == "admit" || op == "seat" {
		if open {
			mStateFailOpen.Inc()
		} else {
			mStateFailShut.Inc()
		}
	}
	r.log.Warn("state store error", "op", op, "err", err, "fail_open", open)
	return open
}

func (r *redisState) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*time.Second)
}

// admitArgs returns the keys and arguments of ts's admission (admitLua)
// and the member its concurrency slot would take.
func (r *redisState) admitArgs(st *userState, t *template, cs *calState, e estimate, dry bool, now int64) ([]string, []any, string) {
	hk, sk := r.userKeys(st.name)
	nowMS := now / 1e6
	member := r.member()
	args := make([]any, 0, admitArgc+9)
	args = append(args, nowMS, member, nowMS+r.ttl.Milliseconds(), t.concLimit, t.rpm, t.tpm, min(e.tpm, t.tpm), e.tpm, b01(dry), 2*r.ttl.Milliseconds())
	for p := range numPeriods {
		w := &t.win[p]
		if !t.quota || !w.on {
			args = append(args, 0, 0, 0, 0, 0)
			continue
		}
		args = append(args, cs.win[p].start, w.maxReq, w.maxTok, e.quota, cs.win[p].end-cs.win[p].start)
	}
	// The deadline is the real clock's, not now's (Options.Now): it
	// bounds the call's time in transit, by Redis's clock.
	args = append(args, time.Now().Add(r.callLife).UnixMilli())
	return []string{hk, sk, hk + ":f:" + member}, args, member
}

// admitted applies the admission script's answer res (admitRes values)
// to ts: the failed rules and the retry time; ts holds what was taken when
// the admission passed (or in dry run), and the rate limits (not in dry
// run).
func (r *redisState) admitted(res []int64, t *template, ts *ticketState, cs *calState, e estimate, dry bool, now int64, member string, keys []string) (failures, int64) {
	f := failures(res[0])
	retry := min(max(res[1], res[2]), maxWait/1_000_000) * 1e6 // ms: a bucket far below zero waits centuries
	if !dry {
		ts.lim = remoteLimits(t, res[3:5], res[5:7])
	}
	// The start of the window each period counts in: this router's, or a
	// later one another router began (this admission is late).
	var start [numPeriods]int64
	for p := range numPeriods {
		start[p] = cs.win[p].start
		if x := res[7+p]; x > start[p] {
			start[p] = x
		}
		if f.has(quotaRequestsCode(p)) || f.has(quotaTokensCode(p)) {
			end := cs.win[p].end
			if start[p] != cs.win[p].start {
				// A later window: its own end (a month or a DST day
				// may be longer or shorter than this router's).
				end = cs.later(p, start[p]).end
			}
			retry = max(retry, end*1e9-now) // to the ns: Retry-After-Ms
		}
	}
	if f == 0 || dry {
		ts.at = now
		ts.remote = true
		ts.member, ts.mark = member, keys[2]
		ts.conc = t.concLimit > 0
		ts.rpm = t.rpm > 0
		ts.tpm = t.tpm > 0
		ts.tpmEst, ts.tpmPrompt = e.tpm, e.tpmPrompt
		if t.quota {
			ts.quotaEst, ts.quotaPrompt = e.quota, e.quotaPrompt
			for p := range numPeriods {
				if t.win[p].on {
					ts.win[p] = takenWin{on: true, start: start[p]}
				}
			}
		}
		if ts.conc {
			r.mu.Lock()
			r.leases[member] = []string{keys[1]}
			r.mu.Unlock()
		}
	}
	return f, retry
}

// admitUser runs the admission script for ts (one round trip).
func (r *redisState) admitUser(st *userState, t *template, ts *ticketState, cs *calState, e estimate, dry bool, now int64) (failures, int64, error) {
	keys, args, member := r.admitArgs(st, t, cs, e, dry, now)
	res, err := r.call(admitScript, keys, args...).Int64Slice()
	if err != nil {
		r.unadmit(err, st, t, e, now, keys, member, "", nil)
		return 0, 0, err
	}
	if err := r.admitFailed(res, admitRes, args); err != nil {
		return 0, 0, err
	}
	f, retry := r.admitted(res, t, ts, cs, e, dry, now, member, keys)
	return f, retry, nil
}

// admitFailed returns the error of an admission's answer res (n values;
// args its arguments) that took nothing: Redis ran it past its deadline
// (admitLua), or it is malformed.
func (r *redisState) admitFailed(res []int64, n int, args []any) error {
	if len(res) == n && res[0] == -2 {
		late := time.Duration(res[1]-args[admitArgc-1].(int64)) * time.Millisecond
		return fmt.Errorf("the state store ran the admission %v past its deadline (%v after it was made, by its clock and this router's): is this router's clock behind the state store's?", late, late+r.callLife)
	}
	if len(res) != n || res[0] < 0 {
		return fmt.Errorf("admission script returned %d values (%v)", len(res), res)
	}
	return nil
}

// unadmit queues the return of what an admission that failed with err
// may have taken (keys: the user's hash, slot set and the ticket's mark;
// smember and skeys: its first seat, admitSeatScript, if asked for): a
// connection reset after the admission was sent, or a timeout, lost its
// answer, maybe after Redis ran it (a timed-out call still runs when
// Redis reads it). Its request is refused (fail closed) or admitted
// uncounted (fail open), so the request count, the RPM token, the token
// estimate and the slot and seat it took go back: one end (endUnadmit)
// that gives back exactly what the admission recorded, once, and that
// the admission, should it run after it, finds and takes nothing
// (admitLua). It is sent until it lands (keepFailedEnds), and settles at
// the admission's time now, as finishUser does. A call never sent
// (closed, failed at once in a stall, or it could not connect) took
// nothing.
func (r *redisState) unadmit(err error, st *userState, t *template, e estimate, now int64, keys []string, member, smember string, skeys []string) {
	if errors.Is(err, errStateClosed) || errors.Is(err, errStateStalled) || notSent(err) || refusedWrite(err) {
		return
	}
	mStateUndone.Inc()
	args := make([]any, 0, 17)
	args = append(args, member, b01(t.concLimit > 0), now/1e6, 0, t.rpm, t.tpm, -e.tpm, -e.quota, r.wake, "u:"+st.name,
		0, 0, 0, 0, settleMark.Milliseconds(), smember) // the periods' starts are the admission's record
	k := make([]string, 0, 3+len(skeys))
	k = append(append(k, keys...), skeys...)
	r.end(endUnadmit, k, args)
}

// undoSeat queues the return of the seat member a failed seat call
// (seatScript) may have taken in sets: a call that timed out (Redis
// stalled past the client's timeout) or whose connection was reset after
// it was sent still runs when Redis reads it, and the request, refused
// (fail closed) or admitted uncounted (fail open), would never return it:
// every request would meet the phantom until its lease expired. The
// return (releaseLua) removes nothing when the call did not run, and sets
// the call's mark (for settleMark) first: a call Redis runs after both of
// its returns (held in a stalled connection or a proxy's buffer) finds it
// and takes nothing, and one that runs after the mark expired is past its
// deadline (callLife, as an admission's). (An admission's are unadmit's.)
func (r *redisState) undoSeat(err error, member, mark string, sets []string) {
	if errors.Is(err, errStateClosed) || errors.Is(err, errStateStalled) || notSent(err) || refusedWrite(err) {
		// Never sent (closed, failed at once in a stall, or it could not
		// connect), or refused as it wrote: under load in a stall or an
		// outage, those would fill redo and evict real returns and
		// settlements.
		return
	}
	mStateUndone.Inc()
	keys := append(sets[:len(sets):len(sets)], mark)
	args := []any{member, r.wake, "rl", settleMark.Milliseconds()}
	r.end(endRelease, keys, args)
	r.keepRedo(keys, args, false) // once more when Redis answers again
}

// finishUser queues ts's reconciliation in Redis (an end: it rides in the
// next round trip).
func (r *redisState) finishUser(ts *ticketState, served bool, u Usage, now int64) {
	tpmCharge, quotaCharge := ts.charges(served, u)
	st := ts.u.st.Load()
	hk, sk := r.userKeys(st.name)
	rpmCap, tpmCap := int64(0), int64(0) // 0: not taken, or off now
	rpm, tpm := ts.rates()
	if ts.rpm {
		rpmCap = rpm
	}
	if ts.tpm {
		tpmCap = tpm
	}
	args := make([]any, 0, 15)
	args = append(args, ts.member, b01(ts.conc), now/1e6, b01(served), rpmCap, tpmCap, tpmCharge-ts.tpmEst, quotaCharge-ts.quotaEst, r.wake, "u:"+st.name)
	for p := range numPeriods {
		if ts.win[p].on {
			args = append(args, ts.win[p].start)
		} else {
			args = append(args, 0)
		}
	}
	args = append(args, settleMark.Milliseconds())
	if ts.conc {
		r.mu.Lock()
		delete(r.leases, ts.member)
		r.mu.Unlock()
	}
	r.end(endFinish, []string{hk, sk, ts.mark}, args)
	if ts.conc {
		r.kickUser(st) // a local waiter may take the slot at once (its call runs after this end)
	}
}

// admitRemote is Admit with the counters in Redis. With sa it also takes
// the request's first seat in the same script (AdmitAcquire), and does not
// wait in the user's queue (sa.queue).
func (g *Governor) admitRemote(ctx context.Context, s *snapshot, u *User, t *template, ts *ticketState, cs *calState, r Request, e estimate, dry bool, now int64, sa *seatAsk) (Ticket, *Rejection) {
	st := g.state(u)
	if t.concQueue && !dry {
		st.mu.Lock()
		if st.q.n > 0 { // no overtaking the queue
			if sa != nil {
				st.mu.Unlock()
				g.putTicket(ts)
				sa.queue = true
				return Ticket{}, nil
			}
			return g.queueUser(ctx, u, t, ts, r, e)
		}
		st.mu.Unlock()
	}
	var f failures
	var retry int64
	var err error
	if sa != nil {
		f, retry, err = g.admitSeatRemote(s, st, t, ts, cs, e, dry, now, sa)
	} else {
		f, retry, err = g.rds.admitUser(st, t, ts, cs, e, dry, now)
	}
	if err != nil {
		if g.rds.failed("admit", err, s.userOpen) {
			return ts.handle(u), nil // fail open: nothing to give back
		}
		g.putTicket(ts)
		u.rejected()
		return Ticket{}, reject(CodeStateUnavailable, 0, false)
	}
	if f != 0 {
		if !dry && f == 1<<CodeConcurrencyUser && t.concQueue {
			if sa != nil {
				g.putTicket(ts)
				sa.queue = true
				return Ticket{}, nil
			}
			st.mu.Lock()
			return g.queueUser(ctx, u, t, ts, r, e) // counts it
		}
		hits(f, dry)
		if !dry {
			rej := reject(f.first(), retry, false)
			rej.Limits = ts.lim
			g.putTicket(ts)
			u.rejected()
			return Ticket{}, rej
		}
	}
	return ts.handle(u), nil
}

// admitSeatRemote runs the admission and, when it passes, the first seat
// acquisition of sa in one script (one round trip). When the seat could
// not be asked for in the same script (every candidate has requests
// queued here, or the script failed) sa is left for TryAcquire.
func (g *Governor) admitSeatRemote(s *snapshot, st *userState, t *template, ts *ticketState, cs *calState, e estimate, dry bool, now int64, sa *seatAsk) (failures, int64, error) {
	r := g.rds
	rl := &s.rl
	if !rl.limited || len(sa.targets) == 0 {
		return r.admitUser(st, t, ts, cs, e, dry, now) // no seat to take: TryAcquire answers without Redis
	}
	_, cands, idx := g.seatCandidates(rl, sa.targets)
	if len(cands) == 0 {
		return r.admitUser(st, t, ts, cs, e, dry, now)
	}
	keys, args, member := r.admitArgs(st, t, cs, e, dry, now)
	skeys, sargs, smember := r.seatArgs(rl, cands, sa.ph, rl.dry)
	keys = append(keys, skeys...)
	args = append(args, sargs...)
	res, err := r.call(admitSeatScript, keys, args...).Int64Slice()
	if err != nil {
		r.unadmit(err, st, t, e, now, keys[:3], member, smember, skeys)
		return 0, 0, err
	}
	if err := r.admitFailed(res, admitRes+3, args); err != nil {
		return 0, 0, err
	}
	f, retry := r.admitted(res[:admitRes], t, ts, cs, e, dry, now, member, keys[:3])
	if res[admitRes] >= 0 { // the seat was asked for
		ss, i, code := r.seated(res[admitRes:], rl, cands, sa.ph, smember)
		sa.seat, sa.idx, sa.rej = g.seatAnswer(rl, ss, i, idx, code)
		sa.done = true
	}
	return f, retry, nil
}

// kickUser asks the queue loop to serve st's queue.
func (r *redisState) kickUser(st *userState) {
	st.mu.Lock()
	n := st.q.n
	st.mu.Unlock()
	if n == 0 {
		return
	}
	r.mu.Lock()
	r.dirty[st] = struct{}{}
	r.mu.Unlock()
	r.poke()
}

func (r *redisState) kickSeats() { r.poke() }

func (r *redisState) poke() { nudge(r.kick) }

// nudge wakes the loop waiting on ch (capacity 1) unless it is already
// due to wake.
func nudge(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// loop serves the queues (on kicks, release notifications and every
// PollInterval while requests wait) and renews leases.
func (r *redisState) loop() {
	defer r.g.wg.Done()
	poll := time.NewTicker(r.g.opts.PollInterval)
	defer poll.Stop()
	hb := time.NewTicker(r.ttl / 3)
	defer hb.Stop()
	for {
		select {
		case <-r.g.stop:
			return
		case <-hb.C:
			r.heartbeat()
			continue
		case <-r.kick:
		case <-poll.C:
		}
		r.pumpUsers()
		r.pumpSeats()
		r.flushRedo()
	}
}

// flushRedo sends the returns kept for sending again (redo) when no
// pipeline would: they go ahead of the router's next pipeline, or once
// Redis answered one, and a router without traffic sent none, so the slot
// or seat of a call that timed out in a stall (Redis ran it when it read
// it) stayed taken for every router until its lease expired. Not in a
// stall's hold: its probe carries them.
func (r *redisState) flushRedo() {
	if until := r.stalled.Load(); until != 0 && time.Now().UnixNano() < until || r.redoHeld() {
		return
	}
	r.qmu.Lock()
	idle := r.keptLocked() > 0 && !r.busy && len(r.q) == 0 && !r.closed
	r.qmu.Unlock()
	if !idle || !r.flushing.CompareAndSwap(false, true) {
		return
	}
	r.g.wg.Add(1)
	go func() {
		defer r.g.wg.Done()
		defer r.flushing.Store(false)
		r.call(endsScript, nil) // an answer sends the rest (exec, resendRedo)
	}()
}

// listen turns release notifications into kicks.
func (r *redisState) listen() {
	defer r.g.wg.Done()
	ch := r.ps.Channel()
	for {
		select {
		case <-r.g.stop:
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			if name, ok := cutPrefix(m.Payload, "u:"); ok {
				r.g.mu.Lock()
				st := r.g.states[name]
				r.g.mu.Unlock()
				if st != nil {
					r.kickUser(st)
				}
			} else {
				r.poke()
			}
		}
	}
}

func cutPrefix(s, p string) (string, bool) {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):], true
	}
	return "", false
}

// heartbeat renews the leases of every slot and seat this router holds,
// adding back those Redis lost (renewLua). The renewals are ends, queued
// under r.mu as the returns are: a return queued after a renewal runs
// after it, and a slot or seat returned before is no longer in r.leases,
// so no renewal brings a returned member back. (A renewal that only
// updated members still present, in a pipeline of its own, left a
// request's slot and seat uncounted for the rest of the request once
// Redis lost them: every router admitted past the limits meanwhile.)
func (r *redisState) heartbeat() {
	exp := r.g.now().UnixMilli() + r.ttl.Milliseconds()
	ttl := 2 * r.ttl.Milliseconds()
	r.mu.Lock()
	defer r.mu.Unlock()
	for m, keys := range r.leases {
		r.end(endRenew, keys, []any{m, exp, ttl})
	}
}

// pumpUsers serves the heads of the queues of dirty users.
func (r *redisState) pumpUsers() {
	r.mu.Lock()
	users := make([]*userState, 0, len(r.dirty))
	for st := range r.dirty {
		users = append(users, st)
	}
	r.mu.Unlock()
	s := r.g.snap.Load()
	for _, st := range users {
		for {
			st.mu.Lock()
			w := st.q.head
			if w == nil {
				r.mu.Lock() // after st.mu: a kickUser for a waiter queued since marks st dirty again
				delete(r.dirty, st)
				r.mu.Unlock()
				st.mu.Unlock()
				break
			}
			if rej := s.revoked(st.name, &w.r); rej != nil {
				if w.state == waiting {
					st.q.remove(w)
					w.state, w.rej = rejected, rej
					w.ch <- struct{}{}
				}
				st.mu.Unlock()
				continue
			}
			st.mu.Unlock()
			now := r.g.now().UnixNano()
			if rej, _ := r.g.outsideQueued(s, st, w, now); rej != nil {
				st.mu.Lock()
				if w.state == waiting {
					st.q.remove(w)
					w.state, w.rej = rejected, rej
					w.ch <- struct{}{}
				}
				st.mu.Unlock()
				continue
			}
			t, e := w.current(s, st)
			if t == nil { // no rule counts any more: nothing to take
				st.mu.Lock()
				if w.state == waiting {
					st.q.remove(w)
					w.ts.at = now
					w.state = granted
					w.ch <- struct{}{}
				}
				st.mu.Unlock()
				continue
			}
			w.ts.t = t // before the round trip: finishUser gives back what t took
			cs := s.cal.state(now / 1e9)
			dry := s.userDry || t.dry
			f, retry, err := r.admitUser(st, t, w.ts, cs, e, dry, now)
			if err == errStateClosed {
				return // shutting down: the waiters end with their requests
			}
			if err == nil && f == 1<<CodeConcurrencyUser && !dry && t.concQueue {
				break // still full: wait for the next release or poll
			} // (full, and overlimit is reject now: refused below)
			st.mu.Lock()
			if w.state != waiting { // it left during the round trip (queueUser dequeued it)
				st.mu.Unlock()
				if err == nil && (f == 0 || dry) {
					r.finishUser(w.ts, false, Usage{}, now)
				}
				continue
			}
			st.q.remove(w)
			switch {
			case err != nil && !r.failed("admit", err, s.userOpen):
				w.state, w.rej = rejected, reject(CodeStateUnavailable, 0, false)
			case err != nil:
				w.state = granted
			case f != 0 && !dry:
				hits(f, false)
				w.state, w.rej = rejected, reject(f.first(), retry, false)
				w.rej.Limits = w.ts.lim
			default:
				w.state = granted
			}
			w.ch <- struct{}{}
			st.mu.Unlock()
		}
	}
}

// pumpSeats offers seats to queued requests in arrival order; a pass
// skips scopes it found full.
func (r *redisState) pumpSeats() {
	l := &r.g.seats
	l.mu.Lock()
	if l.q.n == 0 {
		l.mu.Unlock()
		return
	}
	ws := make([]*seatWaiter, 0, l.q.n)
	for w := l.q.head; w != nil; w = w.next {
		ws = append(ws, w)
	}
	l.mu.Unlock()
	rl := &r.g.snap.Load().rl
	full := map[*counters]bool{}
	for _, w := range ws {
		l.mu.Lock()
		gone := w.state != waiting // it left since the copy (waitSeat dequeued it)
		l.mu.Unlock()
		if gone {
			continue
		}
		var cands []levels
		var idx []int
		for i := range w.lvs {
			if c := w.lvs[i][rl.scope]; !full[c] {
				cands, idx = append(cands, w.lvs[i]), append(idx, i)
			}
		}
		if len(cands) == 0 {
			continue
		}
		var seat Seat
		i, err := 0, error(nil) // no limit any more: a zero Seat
		if rl.limited {
			var ss *seatState
			ss, i, _, err = r.acquireSeat(rl, cands, w.ph, rl.dry) // in dry run nothing waits
			if err == errStateClosed {
				return // shutting down: the waiters end with their requests
			}
			if ss != nil {
				seat = Seat{ss: ss, gen: ss.state.Load() >> ssFlags}
			}
		}
		if err == nil && i < 0 {
			for _, lv := range cands {
				full[lv[rl.scope]] = true
			}
			continue
		}
		l.mu.Lock()
		if w.state != waiting { // it left during the round trip (waitSeat dequeued it)
			l.mu.Unlock()
			seat.Done() // the seat taken for it goes back (a zero Seat does nothing)
			continue
		}
		l.dequeueLocked(w)
		switch {
		case err != nil && !r.failed("seat", err, rl.open):
			w.state, w.rej = rejected, reject(CodeStateUnavailable, 0, false)
		case err != nil:
			w.state, w.idx = granted, idx[0]
		default:
			w.state, w.seat, w.idx = granted, seat, idx[i]
		}
		w.ch <- struct{}{}
		l.mu.Unlock()
	}
	l.mu.Lock()
	l.refuseQueuedLocked()
	l.mu.Unlock()
}

// seatArgs returns the keys and arguments of a seat acquisition over
// cands, each a candidate's counters at every scope (seatLua: the
// configured scope's sets), and the seat's member.
func (r *redisState) seatArgs(rl *rlConf, cands []levels, ph Phase, dry bool) ([]string, []any, string) {
	keys := make([]string, 0, 3*len(cands))
	for _, lv := range cands {
		c := lv[rl.scope]
		keys = append(keys, c.keys[0], c.keys[1], c.keys[2])
	}
	now := r.g.now().UnixMilli()
	member := r.member()
	return keys, []any{now, now + r.ttl.Milliseconds(), member, parts(ph), rl.lim[0], rl.lim[1], rl.lim[2], b01(dry), 2 * r.ttl.Milliseconds()}, member
}

// seated turns the seat script's answer res (3 values) into the seat's
// state and the index of the chosen candidate, or -1 and the code of the
// first full counter.
func (r *redisState) seated(res []int64, rl *rlConf, cands []levels, ph Phase, member string) (*seatState, int, Code) {
	code := phaseCode(ph, &rl.lim)
	if res[1] >= 1 && res[1] <= 3 {
		code = counterCodes[res[1]-1]
	}
	if res[0] <= 0 || int(res[0]) > len(cands) {
		return nil, -1, code
	}
	if res[2] == 0 {
		code = CodeNone // a seat within the limit
	}
	lv := cands[res[0]-1]
	p := parts(ph)
	ss := r.g.seatPool.Get().(*seatState)
	ss.lv = levels{}
	for k, c := range lv {
		ss.keys[k] = c.keys
	}
	ss.origin, ss.in = rl.scope, 1<<rl.scope
	ss.member, ss.remote = member, true
	gen := ss.state.Load()>>ssFlags + 1
	ss.state.Store(gen<<ssFlags | ssActive | p)
	for i := range 3 {
		if p&(1<<i) != 0 {
			heldSeats[i].Add(1)
		}
	}
	r.mu.Lock()
	r.leases[member] = ss.heldKeys(p)
	r.seats[member] = ss
	r.followScope(ss) // a reload may have changed the scope during the round trip
	r.mu.Unlock()
	return ss, int(res[0] - 1), code
}

// acquireSeat runs the seat script over cands (one round trip); it
// returns the seat's state and the index of the chosen candidate, or -1
// and the code of the first full counter.
func (r *redisState) acquireSeat(rl *rlConf, cands []levels, ph Phase, dry bool) (*seatState, int, Code, error) {
	keys, args, member := r.seatArgs(rl, cands, ph, dry)
	sets := keys
	mark := r.prefix + "{rl}:f:" + member
	keys = append(keys[:len(keys):len(keys)], mark)
	// The deadline is the real clock's (callLife), as an admission's.
	args = append(args, time.Now().Add(r.callLife).UnixMilli())
	res, err := r.call(seatScript, keys, args...).Int64Slice()
	if err != nil {
		r.undoSeat(err, member, mark, sets)
		return nil, -1, CodeNone, err
	}
	if len(res) == 3 && res[0] == -2 {
		late := time.Duration(res[1]-args[len(args)-1].(int64)) * time.Millisecond
		return nil, -1, CodeNone, fmt.Errorf("the state store ran the seat call %v past its deadline (%v after it was made, by its clock and this router's): is this router's clock behind the state store's?", late, late+r.callLife)
	}
	if len(res) != 3 || res[0] < 0 {
		return nil, -1, CodeNone, fmt.Errorf("seat script returned %d values (%v)", len(res), res)
	}
	ss, i, code := r.seated(res, rl, cands, ph, member)
	return ss, i, code, nil
}

// releaseSeat queues the return of the held counters of ss (an end: it
// rides in the next round trip).
func (r *redisState) releaseSeat(ss *seatState, held uint64) {
	for i := range 3 {
		if held&(1<<i) != 0 {
			heldSeats[i].Add(-1)
		}
	}
	r.mu.Lock()
	// The sets it is in (ss.in) and the order of the ends are decided
	// under r.mu, as followScope decides them: a return queued after a
	// migration removes the seat from the sets it was copied to.
	keys := ss.heldKeys(held)
	if rest := ss.state.Load() & ssHeld; rest == 0 {
		delete(r.leases, ss.member)
		delete(r.seats, ss.member)
	} else if _, ok := r.leases[ss.member]; ok { // Done may have run already
		r.leases[ss.member] = ss.heldKeys(rest)
	}
	r.end(endRelease, keys, []any{ss.member, r.wake, "rl"})
	r.mu.Unlock()
	r.poke() // a local waiter may take the seat at once (its call runs after this end)
}

// followScopes copies the seats this router holds into the sets of the
// configured rate_limit.scope (after a reload that changed it), so the
// new scope's counters include the seats in flight.
func (r *redisState) followScopes() {
	r.mu.Lock()
	for _, ss := range r.seats {
		r.followScope(ss)
	}
	r.mu.Unlock()
}

// followScope queues the copy of ss into the sets of the configured scope,
// unless they hold it already: an end (migrateLua), run in order with the
// others, that copies only a seat still in the sets it was taken in (one
// returned before it ran is not). r.mu must be held.
func (r *redisState) followScope(ss *seatState) {
	k := r.g.snap.Load().rl.scope
	held := ss.state.Load() & ssHeld
	if ss.in&(1<<k) != 0 || held == 0 {
		return
	}
	ss.in |= 1 << k
	keys := make([]string, 0, 4)
	for i := range 3 {
		if held&(1<<i) != 0 {
			keys = append(keys, ss.keys[ss.origin][i], ss.keys[k][i])
		}
	}
	r.leases[ss.member] = ss.heldKeys(held)
	r.end(endMigrate, keys, []any{ss.member, r.g.now().UnixMilli() + r.ttl.Milliseconds(), 2 * r.ttl.Milliseconds()})
}

// moveService moves the seats this router holds on the instance whose
// sets are inst into the sets of the service whose sets are svc (a reload
// or the discovery moved the instance to that service): a seat in its old
// service's sets is copied to the new ones and then removed from the old
// (two ends, in order with the others: one returned before they run is
// neither copied nor left behind), and its later return and a scope reload
// use the new service's sets. O(seats held), at a worker's registration.
func (r *redisState) moveService(inst, svc [3]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ss := range r.seats {
		if ss.keys[scopeInstance] != inst || ss.keys[scopeService] == svc {
			continue
		}
		old := ss.keys[scopeService]
		ss.keys[scopeService] = svc
		if ss.in&(1<<scopeService) == 0 {
			continue
		}
		// held lacks the counters whose return is under way (Done or
		// FirstToken took them, their end is not queued yet): that end
		// will name the new sets, so the old ones are cleared of every
		// counter here, not only of those copied.
		if held := ss.state.Load() & ssHeld; held != 0 {
			keys := make([]string, 0, 4)
			for i := range 3 {
				if held&(1<<i) != 0 {
					keys = append(keys, old[i], svc[i])
				}
			}
			r.leases[ss.member] = ss.heldKeys(held)
			r.end(endMigrate, keys, []any{ss.member, r.g.now().UnixMilli() + r.ttl.Milliseconds(), 2 * r.ttl.Milliseconds()})
		}
		r.end(endRelease, old[:], []any{ss.member, r.wake, "rl"})
	}
}

// seatCandidates returns the counters of targets at every scope (lvs, one
// per target; a request that queues waits on them), and the counters in
// scope a seat may be taken on now (cands, with their indexes in
// targets): a counter with requests queued here is passed over (no
// overtaking the queue), except in dry run.
func (g *Governor) seatCandidates(rl *rlConf, targets []Target) (lvs []levels, cands []levels, idx []int) {
	l := &g.seats
	l.mu.Lock()
	defer l.mu.Unlock()
	lvs = make([]levels, len(targets))
	for i := range targets {
		lvs[i] = l.levels(&targets[i])
		if c := lvs[i][rl.scope]; c.waiting == 0 || rl.dry {
			cands, idx = append(cands, lvs[i]), append(idx, i)
		}
	}
	return lvs, cands, idx
}

// seatAnswer is the answer of a seat acquisition in Redis that did not
// wait: the seat on targets[idx[i]], or the refusal (counted unless the
// caller may queue next).
func (g *Governor) seatAnswer(rl *rlConf, ss *seatState, i int, idx []int, code Code) (Seat, int, *Rejection) {
	if i >= 0 {
		if code != CodeNone {
			hit(code, true) // dry run: taken over the limit
		}
		return Seat{ss: ss, gen: ss.state.Load() >> ssFlags}, idx[i], nil
	}
	if !rl.queue {
		hit(code, false)
	}
	return Seat{}, -1, reject(code, 0, false)
}

// acquireRemote is acquire with the seats in Redis.
func (g *Governor) acquireRemote(ctx context.Context, rl *rlConf, targets []Target, ph Phase, wait bool, stale func() *Rejection) (Seat, int, *Rejection) {
	l := &g.seats
	r := g.rds
	lvs, cands, idx := g.seatCandidates(rl, targets)
	code := phaseCode(ph, &rl.lim)
	if len(cands) > 0 {
		ss, i, c, err := r.acquireSeat(rl, cands, ph, rl.dry)
		if err != nil {
			if r.failed("seat", err, rl.open) {
				return Seat{}, 0, nil
			}
			return Seat{}, -1, reject(CodeStateUnavailable, 0, false)
		}
		if i >= 0 || !rl.queue || !wait {
			return g.seatAnswer(rl, ss, i, idx, c)
		}
		code = c
	}
	if !rl.queue {
		hit(code, false)
		return Seat{}, -1, reject(code, 0, false)
	}
	if !wait {
		return Seat{}, -1, reject(code, 0, false) // not counted: the caller queues next
	}
	l.mu.Lock()
	if l.q.n >= rl.queueSize {
		l.mu.Unlock()
		hit(code, false)
		return Seat{}, -1, reject(code, 0, true)
	}
	w := &seatWaiter{ch: make(chan struct{}, 1), ph: ph, code: code, since: time.Now(), lvs: lvs, stale: stale}
	if rej := l.enqueueLocked(w); rej != nil {
		l.mu.Unlock()
		return Seat{}, -1, rej
	}
	seatQueued.Add(1)
	l.mu.Unlock()
	hitQueued(code)
	r.poke()
	return g.waitSeat(ctx, w)
}

func b01(b bool) int {
	if b {
		return 1
	}
	return 0
}
