package govern

import (
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Records are small keyed records that other packages keep in the state
// store beside the counters, so that every router sharing it reads them:
// the proxy's table of stored Responses (which engine holds a response
// id, for whom). A record is opaque bytes under a key of the caller's,
// set once and kept until its TTL ends. The calls go through the same
// dispatcher as the counters' scripts (they ride in its pipelines, fail at
// once while Redis is stalled, and are sent again after a script flush);
// they are never retried.
type Records struct{ r *redisState }

// Records returns the records of the state store, nil with in-process
// counters (no --state).
func (g *Governor) Records() *Records {
	if g.rds == nil {
		return nil
	}
	return &Records{r: g.rds}
}

// keepScript sets KEYS[1] to ARGV[1] for ARGV[2] ms unless it holds a
// record, and answers the record it holds then (ARGV[1], or the earlier).
var keepScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
`)

// findScript answers KEYS[1]'s record, "" when it holds none (records are
// never empty: Keep refuses one).
var findScript = redis.NewScript(`return redis.call('GET', KEYS[1]) or ''`)

var errEmptyRecord = errors.New("BUG: an empty record")

// Keep stores val under key for ttl (at least 1 ms) unless key holds a
// record already, and returns the record key holds afterwards: val, or the
// one an earlier Keep stored there (the first record stays).
func (rc *Records) Keep(key string, val []byte, ttl time.Duration) ([]byte, error) {
	if len(val) == 0 {
		return nil, errEmptyRecord
	}
	ms := max(ttl.Milliseconds(), 1)
	b, err := rc.r.call(keepScript, []string{rc.r.prefix + key}, val, strconv.FormatInt(ms, 10)).Text()
	if err != nil {
		return nil, err
	}
	return []byte(b), nil
}

// Find returns the record under key, nil when there is none.
func (rc *Records) Find(key string) ([]byte, error) {
	b, err := rc.r.call(findScript, []string{rc.r.prefix + key}).Text()
	if err != nil || b == "" {
		return nil, err
	}
	return []byte(b), nil
}
