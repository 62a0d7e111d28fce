package redisindex

import "github.com/redis/go-redis/v9"

// Lua scripts. Each touches keys of ONE hash slot only (a block key, or the
// pods hash), so they run unchanged on Redis Cluster. In single-node mode the
// block scripts are called with many KEYS at once (one script run per Add);
// in Cluster mode with one key per call, pipelined, because a script may not
// touch keys of several slots.
//
// The block scripts return one code per key, a set of the blockCode bits
// below; the Lua side spells them as numbers (1, 2, 4, 8).

// blockCode is the per-key result of addScript / removeScript.
type blockCode int64

const (
	// codeEntry: a live entry of this (pod, tier, group) was created (add)
	// / deleted (remove).
	codeEntry blockCode = 1 << iota
	// codeKey: the key was created (add) / became empty and vanished
	// (remove).
	codeKey
	// codeBehind: the stored entry carries a NEWER epoch than the caller
	// used: the caller's epoch cache is behind; it reloads epochs and
	// retries.
	codeBehind
	// codeBlock: the pod did not hold this block on any tier/group before
	// (add) / holds it on none after (remove): PodBlocks counts blocks, not
	// entries.
	codeBlock
)

func (c blockCode) has(bit blockCode) bool { return c&bit != 0 }

// podHolds: does the hash k hold a live (epoch >= ne) field of pod podF
// other than except? Fields are "<tier>.<group>.<podF>"; a hash has one
// field per holder, a handful.
const luaPodHolds = `
local function podHolds(k, podF, ne, except)
  local kv = redis.call('HGETALL', k)
  for j = 1, #kv, 2 do
    local f = kv[j]
    if f ~= except and tonumber(kv[j+1]) >= ne and string.match(f, '^%d+%.%d+%.(.*)$') == podF then
      return true
    end
  end
  return false
end
`

// addScript: KEYS = block keys; ARGV = field, epoch, ttl ms (<=0: none), pod
// field. Never downgrades an entry written under a newer epoch.
var addScript = redis.NewScript(luaPodHolds + `
local field, epoch, ttl, podF = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local ne = tonumber(epoch)
local out = {}
for i, k in ipairs(KEYS) do
  local code = 0
  local old = redis.call('HGET', k, field)
  if old and tonumber(old) > ne then
    code = 4
  elseif old ~= epoch then
    if not old and redis.call('EXISTS', k) == 0 then
      code = 2 + 8
    elseif not podHolds(k, podF, ne, field) then
      code = 8
    end
    redis.call('HSET', k, field, epoch)
    code = code + 1
  end
  if ttl > 0 then redis.call('PEXPIRE', k, ttl) end
  out[i] = code
end
return out
`)

// removeScript: KEYS = block keys; ARGV = field, epoch, pod field. The entry
// is deleted whatever its epoch (the owner's ordered stream says the block
// is gone); only an entry of the current epoch counts as a live removal.
var removeScript = redis.NewScript(luaPodHolds + `
local field, epoch, podF = ARGV[1], ARGV[2], ARGV[3]
local ne = tonumber(epoch)
local out = {}
for i, k in ipairs(KEYS) do
  local code = 0
  local old = redis.call('HGET', k, field)
  if old then
    redis.call('HDEL', k, field)
    if redis.call('EXISTS', k) == 0 then
      code = 2
      if old == epoch then code = code + 1 + 8 end
    elseif old == epoch then
      code = 1
      if not podHolds(k, podF, ne, field) then code = code + 8 end
    end
    if tonumber(old) > ne then code = code + 4 end
  end
  out[i] = code
end
return out
`)

// cleanupScript: KEYS[1] = block key; ARGV = field1, value1, field2, ...
// Deletes each field only if it still holds the stale value the reader saw
// (compare-and-delete), so a concurrent re-add under a new epoch survives.
// Returns {deleted, emptied(0/1)}.
var cleanupScript = redis.NewScript(`
local k = KEYS[1]
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', k, ARGV[i]) == ARGV[i+1] then
    redis.call('HDEL', k, ARGV[i])
    n = n + 1
  end
end
local emptied = 0
if n > 0 and redis.call('EXISTS', k) == 0 then emptied = 1 end
return {n, emptied}
`)

// countScript: KEYS[1] = pods hash; ARGV = pod field, epoch, entries
// delta, blocks delta, keys delta. The pod's counters only move if its
// epoch is still the one the entries were written under (a clear in between
// reset them to 0).
var countScript = redis.NewScript(`
local p, epoch, de, db, dk = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if dk ~= 0 then redis.call('HINCRBY', KEYS[1], '_k', dk) end
if (de ~= 0 or db ~= 0) and (redis.call('HGET', KEYS[1], 'e:' .. p) or '0') == epoch then
  for _, f in ipairs({{'m:', de}, {'n:', db}}) do
    if f[2] ~= 0 and redis.call('HINCRBY', KEYS[1], f[1] .. p, f[2]) < 0 then
      redis.call('HSET', KEYS[1], f[1] .. p, 0)
    end
  end
end
return 0
`)

// clearScript: KEYS[1] = pods hash; ARGV = pod field, highest epoch the
// caller knows for the pod. The new epoch is max(current+1, known+1, server
// time in microseconds): time-based so that a Redis that lost its data (and
// with it the epochs) still never hands out an epoch at or below one that
// entries may still carry. _v changes on every clear; readers compare it to
// their cached copy to notice clears by other daemons.
// Returns {new epoch, previous _v, new _v}.
var clearScript = redis.NewScript(`
local p = ARGV[1]
local cur = tonumber(redis.call('HGET', KEYS[1], 'e:' .. p) or '0')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local new = math.max(cur + 1, now, tonumber(ARGV[2]) + 1)
local ns = string.format('%d', new)
redis.call('HSET', KEYS[1], 'e:' .. p, ns)
redis.call('HSET', KEYS[1], 'n:' .. p, 0)
redis.call('HSET', KEYS[1], 'm:' .. p, 0)
local prev = redis.call('HGET', KEYS[1], '_v') or ''
local c = redis.call('HINCRBY', KEYS[1], '_c', 1)
local v = string.format('%d.%d', now, c)
redis.call('HSET', KEYS[1], '_v', v)
return {ns, prev, v}
`)

// lookupScript (single node only: it reads keys of many slots): KEYS[1] =
// pods hash, KEYS[2..] = block keys in prompt order. Walks the keys, judges
// every entry against its pod's current epoch (read once per pod), deletes
// stale entries on the spot (exact: epoch and entry are read atomically),
// and stops at the first key without a live holder: keys past it are never
// read. Reply: {stale deleted, keys emptied, n1, field..., n2, field...}.
var lookupScript = redis.NewScript(`
local pods = KEYS[1]
local ep, fe = {}, {}
local out = {0, 0}
local no = 2
local deleted, emptied = 0, 0
for i = 2, #KEYS do
  local k = KEYS[i]
  local kv = redis.call('HGETALL', k)
  no = no + 1
  local slot = no
  out[slot] = 0
  local n, dels = 0, 0
  for j = 1, #kv, 2 do
    local f = kv[j]
    -- fe: field -> its pod's epoch (false: malformed); a prompt's keys
    -- share a handful of fields, so each is parsed once per call.
    local e = fe[f]
    if e == nil then
      local p = string.match(f, '^%d+%.%d+%.(.*)$')
      e = false
      if p then
        e = ep[p]
        if e == nil then
          e = tonumber(redis.call('HGET', pods, 'e:' .. p) or '0')
          ep[p] = e
        end
      end
      fe[f] = e
    end
    local v = tonumber(kv[j + 1])
    if not e or not v or v >= e then
      n = n + 1
      no = no + 1
      out[no] = f
    else
      redis.call('HDEL', k, f)
      dels = dels + 1
    end
  end
  deleted = deleted + dels
  if dels > 0 and n == 0 then emptied = emptied + 1 end
  if n == 0 then
    out[slot] = nil
    break
  end
  out[slot] = n
end
out[1], out[2] = deleted, emptied
return out
`)

var allScripts = []*redis.Script{addScript, removeScript, cleanupScript, countScript, clearScript, lookupScript}
