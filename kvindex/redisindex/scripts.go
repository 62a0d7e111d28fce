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
	// codeEntry: a live entry of this (pod, tier) was created (add)
	// / deleted (remove).
	codeEntry blockCode = 1 << iota
	// codeKey: the key was created (add) / became empty and vanished
	// (remove).
	codeKey
	// codeBehind: the stored entry carries a NEWER epoch than the caller
	// used: the caller's epoch cache is behind; it reloads epochs and
	// retries.
	codeBehind
	// codeBlock: the pod did not hold this block on any tier before
	// (add) / holds it on none after (remove): PodBlocks counts blocks, not
	// entries.
	codeBlock
)

func (c blockCode) has(bit blockCode) bool { return c&bit != 0 }

// A block key is a STRING: the concatenation of one record per holder,
//
//	2 bytes  field length L (big endian)
//	L bytes  field "<tier>.0.<rank>.<pod name>"
//	8 bytes  epoch the entry was written under (big endian)
//
// so a lookup is one MGET (a few hundred bytes per key) instead of one
// HGETALL per key. The scripts below share the record walk: luaRecords
// defines scan (find the caller's own record and whether its pod holds the
// block through another live record) and getv (read a key; a key of another
// type, such as the HASH of the previous layout, reads as absent; the next
// add overwrites it).
const luaRecords = `
local function podOf(f)
  return string.match(f, '^%d+%.%d+%.(.*)$')
end
local function getv(k)
  local v = redis.pcall('GET', k)
  if type(v) ~= 'string' then return false end
  return v
end
-- scan(v, field, podF, ne) -> own record [s, e) and epoch (nil when
-- absent), whether another record of podF is live (epoch >= ne), and
-- whether v is malformed (then nothing else is reliable).
local function scan(v, field, podF, ne)
  local pos, n = 1, #v
  local s, e, ep, other = nil, nil, nil, false
  while pos <= n do
    if pos + 9 > n then return s, e, ep, other, true end
    local L = struct.unpack('>I2', v, pos)
    local nxt = pos + 10 + L
    if nxt - 1 > n then return s, e, ep, other, true end
    local f = string.sub(v, pos + 2, pos + 1 + L)
    local re = struct.unpack('>I8', v, pos + 2 + L)
    if f == field then
      s, e, ep = pos, nxt, re
    elseif not other and re >= ne and podOf(f) == podF then
      other = true
    end
    pos = nxt
  end
  return s, e, ep, other, false
end
local function put(k, v, ttl)
  if ttl > 0 then
    redis.call('SET', k, v, 'PX', ttl)
  else
    redis.call('SET', k, v, 'KEEPTTL')
  end
end
`

// addScript: KEYS = block keys; ARGV = record (as encodeRecord builds it),
// field, epoch, ttl ms (<=0: none), pod field. Never downgrades an entry
// written under a newer epoch.
var addScript = redis.NewScript(luaRecords + `
local rec, field, ne, ttl, podF = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local out = {}
for i, k in ipairs(KEYS) do
  local code = 0
  local nv = nil
  local v = redis.pcall('GET', k)
  if v == false then
    nv, code = rec, 1 + 2 + 8
  elseif type(v) ~= 'string' then
    nv, code = rec, 1 + 8
  else
    local s, e, ep, other, bad = scan(v, field, podF, ne)
    if bad then
      nv, code = rec, 1 + 8
    elseif ep and ep > ne then
      code = 4
    elseif ep ~= ne then
      if s then
        nv = string.sub(v, 1, s - 1) .. rec .. string.sub(v, e)
      else
        nv = v .. rec
      end
      code = 1
      if not other then code = code + 8 end
    end
  end
  if nv then
    put(k, nv, ttl)
  elseif ttl > 0 then
    redis.call('PEXPIRE', k, ttl)
  end
  out[i] = code
end
return out
`)

// removeScript: KEYS = block keys; ARGV = field, epoch, pod field. The entry
// is deleted whatever its epoch (the owner's ordered stream says the block
// is gone); only an entry of the current epoch counts as a live removal.
var removeScript = redis.NewScript(luaRecords + `
local field, ne, podF = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local out = {}
for i, k in ipairs(KEYS) do
  local code = 0
  local v = getv(k)
  if v then
    local s, e, ep, other, bad = scan(v, field, podF, ne)
    if s and not bad then
      local nv = string.sub(v, 1, s - 1) .. string.sub(v, e)
      if nv == '' then
        redis.call('DEL', k)
        code = 2
        if ep == ne then code = code + 1 + 8 end
      else
        redis.call('SET', k, nv, 'KEEPTTL')
        if ep == ne then
          code = 1
          if not other then code = code + 8 end
        end
      end
      if ep > ne then code = code + 4 end
    end
  end
  out[i] = code
end
return out
`)

// cleanupScript: KEYS[1] = block key; ARGV = field1, epoch1, field2, ...
// Deletes each record only if it still carries the stale epoch the reader
// saw (compare-and-delete), so a concurrent re-add under a new epoch
// survives. Returns {deleted, emptied(0/1)}.
var cleanupScript = redis.NewScript(`
local k = KEYS[1]
local v = redis.pcall('GET', k)
if type(v) ~= 'string' then return {0, 0} end
local want = {}
for i = 1, #ARGV, 2 do want[ARGV[i]] = tonumber(ARGV[i + 1]) end
local keep, n, pos, len = {}, 0, 1, #v
while pos <= len do
  if pos + 9 > len then return {0, 0} end
  local L = struct.unpack('>I2', v, pos)
  local nxt = pos + 10 + L
  if nxt - 1 > len then return {0, 0} end
  local f = string.sub(v, pos + 2, pos + 1 + L)
  if want[f] ~= nil and want[f] == struct.unpack('>I8', v, pos + 2 + L) then
    n = n + 1
  else
    keep[#keep + 1] = string.sub(v, pos, nxt - 1)
  end
  pos = nxt
end
if n == 0 then return {0, 0} end
if #keep == 0 then
  redis.call('DEL', k)
  return {n, 1}
end
redis.call('SET', k, table.concat(keep), 'KEEPTTL')
return {n, 0}
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
// every record against its pod's current epoch (read once per pod), deletes
// stale records on the spot (exact: epoch and entry are read atomically),
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
  local v = redis.pcall('GET', k)
  if type(v) ~= 'string' then break end
  no = no + 1
  local slot = no
  out[slot] = 0
  local n, dels = 0, 0
  local keep = {}
  local pos, len = 1, #v
  while pos + 9 <= len do
    local L = struct.unpack('>I2', v, pos)
    local nxt = pos + 10 + L
    if nxt - 1 > len then break end
    local f = string.sub(v, pos + 2, pos + 1 + L)
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
    if not e or struct.unpack('>I8', v, pos + 2 + L) >= e then
      n = n + 1
      no = no + 1
      out[no] = f
      keep[#keep + 1] = string.sub(v, pos, nxt - 1)
    else
      dels = dels + 1
    end
    pos = nxt
  end
  if dels > 0 then
    deleted = deleted + dels
    if n == 0 then
      redis.call('DEL', k)
      emptied = emptied + 1
    else
      redis.call('SET', k, table.concat(keep), 'KEEPTTL')
    end
  end
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
