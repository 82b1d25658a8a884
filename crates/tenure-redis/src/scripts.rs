//! The Lua scripts. Each runs atomically in Redis, so every decision about a seat is
//! made and applied in one round trip.
//!
//! Scripts name keys that are not passed in `KEYS` (the liveness keys of queued
//! waiters, the channels of holders' sessions), so they need a single Redis primary
//! (not Redis Cluster).

use std::sync::LazyLock;

use redis::Script;

/// Helpers shared by the scripts that free or take a seat.
///
/// Numbers above 10^14 (tokens, queue scores, times in µs) are formatted with `num`:
/// Lua's own conversion keeps 14 digits only.
const COMMON: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local function num(x) return string.format('%.0f', x) end
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- The first waiter still waiting (its liveness key `waits .. session` is renewed by
-- each of its attempts), forgetting the others on the way; nil if none (or if too many
-- are gone to look further in one call).
local function live_head(queue, waits)
  for _ = 1, 16 do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then return nil end
    if redis.call('EXISTS', waits .. head) == 1 then return head end
    redis.call('ZREM', queue, head)
  end
  return nil
end
-- Keep the free seat for waiter `head` for `grace` ms, and wake it.
local function reserve(nextkey, channel, head, grace)
  local g = tonumber(grace)
  redis.call('SET', nextkey, head .. ' ' .. num(now_us() + g * 1000), 'PX', num(g * 2 + 1000))
  redis.call('PUBLISH', channel, 'free ' .. head)
end
-- Wake the best waiter still waiting and keep the free seat for it; with nobody
-- waiting, publish a bare `free`.
local function wake_next(queue, channel, waits, nextkey, grace)
  local head = live_head(queue, waits)
  if head then
    reserve(nextkey, channel, head, grace)
  else
    redis.call('DEL', nextkey)
    redis.call('PUBLISH', channel, 'free')
  end
end
-- Whether session `sid` may take the free seat. It is kept for the waiter woken last
-- until that one's deadline (one that lets it pass leaves the queue); else for the best
-- waiter still waiting, which is woken now. With nobody waiting, anyone may take it.
-- A waiting candidate of priority `priority` (nil for a try) with a higher priority
-- than the preemptible waiter the seat is kept for takes it, as it would preempt that
-- waiter right after its grant; not from a handover's waiter.
local function may_take(sid, queue, waits, nextkey, channel, grace, priority)
  local r = redis.call('GET', nextkey)
  if r then
    local sp = string.find(r, ' ', 1, true)
    local who = sp and string.sub(r, 1, sp - 1) or ''
    if who == sid then return true end
    local deadline = sp and tonumber(string.sub(r, sp + 1)) or 0
    local tag = redis.call('GET', waits .. who)
    local score = redis.call('ZSCORE', queue, who)
    if tag and score then
      if now_us() <= deadline then
        local wp, wpre = string.match(tag, '^(%-?%d+) ([01]) ')
        if priority and wp and wpre == '1' and tonumber(score) >= 0
            and tonumber(priority) > tonumber(wp) then
          redis.call('DEL', nextkey)
          return true
        end
        return false
      end
      redis.call('ZREM', queue, who)
      redis.call('DEL', waits .. who)
    end
    redis.call('DEL', nextkey)
  end
  local head = live_head(queue, waits)
  if head == nil or head == sid then return true end
  reserve(nextkey, channel, head, grace)
  return false
end
-- Leave the queue; if the free seat was kept for this session, pass it on.
local function leave(seat, queue, nextkey, sid, channel, waits, grace)
  redis.call('ZREM', queue, sid)
  redis.call('DEL', waits .. sid)
  if redis.call('EXISTS', seat) == 0 then
    local r = redis.call('GET', nextkey)
    if r and string.sub(r, 1, #sid + 1) == sid .. ' ' then
      wake_next(queue, channel, waits, nextkey, grace)
    end
  end
end
"#;

/// The grant of a seat, shared by the acquire scripts: mint the next token (see
/// [`ACQUIRE`]), write the seat (with the candidacy's terms, see
/// [`SeatTerms`](crate::keys::SeatTerms)) for the session's TTL, leave the queue, use up
/// the reservation, and announce it. Returns the token as text.
const GRANT: &str = r#"
local function grant(seat, counter, queue, nextkey, sid, ttl, id, value, terms, channel, waits)
  local t = redis.call('TIME')
  local now_s = t[1] .. string.format('%06d', tonumber(t[2]))
  local now = tonumber(now_s)
  local last = tonumber(redis.call('GET', counter) or '0') or 0
  local token
  if last >= now then
    token = redis.call('INCR', counter)
  else
    redis.call('SET', counter, now_s)
    token = now
  end
  local token_s = num(token)
  redis.call('SET', seat, sid .. '\n' .. token_s .. '\n' .. terms .. '\n' .. id .. '\n' .. value, 'PX', ttl)
  redis.call('ZREM', queue, sid)
  redis.call('DEL', waits .. sid)
  redis.call('DEL', nextkey)
  redis.call('PUBLISH', channel, 'taken ' .. token_s)
  return token_s
end
-- Tell the holder of `seat` (whose value is `cur`) to give it up, once per grant: mark
-- its terms told and publish `preempt <token> <election>` on its session's channel.
-- Unless `force` (a handover), only a preemptible holder of a priority below
-- `priority`. Returns 1 if told now.
local function tell(seat, cur, force, priority, schan, election)
  local a = string.find(cur, '\n', 1, true)
  local b = a and string.find(cur, '\n', a + 1, true)
  local c = b and string.find(cur, '\n', b + 1, true)
  if not c then return 0 end
  local p, pre, told = string.match(string.sub(cur, b + 1, c - 1), '^prio (%-?%d+) ([01]) ([01])$')
  if not p or told == '1' then return 0 end
  if not force and (pre ~= '1' or tonumber(priority) <= tonumber(p)) then return 0 end
  local pttl = redis.call('PTTL', seat)
  if pttl <= 0 then return 0 end
  local marked = string.sub(cur, 1, b) .. 'prio ' .. p .. ' ' .. pre .. ' 1' .. string.sub(cur, c)
  redis.call('SET', seat, marked, 'PX', pttl)
  redis.call('PUBLISH', schan .. string.sub(cur, 1, a - 1),
    'preempt ' .. string.sub(cur, a + 1, b - 1) .. ' ' .. election)
  return 1
end
"#;

/// Take the seat if it is free and not kept for another waiter (see `may_take`), or
/// already this session's, minting the next token; else, when waiting, join the queue
/// (by priority, then arrival) and, if the holder may be preempted and has a lower
/// priority, tell it to give the seat up (once per grant).
///
/// KEYS: seat, counter, queue, session, reservation. ARGV: 1 session id, 2 TTL ms,
/// 3 candidate id, 4 value, 5 wait ("1"/"0"), 6 channel, 7 waiter liveness key prefix,
/// 8 how long a waiter's place is kept without an attempt (ms), 9 priority, 10 seat
/// terms, 11 the priority's lowest queue score, 12 the next band's (exclusive), 13 how
/// long a free seat is kept for the waiter woken (ms), 14 session channel prefix,
/// 15 election, 16 the waiter's tag (see [`waiter_tag`](crate::keys::waiter_tag)).
///
/// Returns `{-1}` if the session is gone, `{1, token}` on a grant, `{0, seat PTTL,
/// queue rank or -1}` if someone else holds it or it is kept for someone else.
///
/// The token is `max(counter + 1, now)` with `now` the server's `TIME` in microseconds
/// since 1970: a counter that Redis lost (restart without persistence) or that lags
/// (failover to a replica that missed writes) still continues above every token handed
/// out before, as long as the server's clock is later than it was at the last grant. (A
/// grant takes more than a microsecond, so tokens never run ahead of the clock.)
const ACQUIRE: &str = r#"
local sid = ARGV[1]
local seat, queue, nextkey = KEYS[1], KEYS[3], KEYS[5]
local channel, waits, grace = ARGV[6], ARGV[7], ARGV[13]
local wait = ARGV[5] == '1'
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('ZREM', queue, sid)
  redis.call('DEL', waits .. sid)
  return {-1}
end
local cur = redis.call('GET', seat)
if cur and string.sub(cur, 1, #sid + 1) == sid .. '\n' then
  return {1, grant(seat, KEYS[2], queue, nextkey, sid, ARGV[2], ARGV[3], ARGV[4], ARGV[10], channel, waits)}
end
if wait then
  if not redis.call('ZSCORE', queue, sid) then
    local band, band_end = tonumber(ARGV[11]), tonumber(ARGV[12])
    local score = band
    local last = redis.call('ZREVRANGEBYSCORE', queue, '(' .. ARGV[12], ARGV[11], 'WITHSCORES', 'LIMIT', 0, 1)
    if last[2] then score = math.min(tonumber(last[2]) + 1, band_end - 1) end
    redis.call('ZADD', queue, num(score), sid)
  end
  redis.call('SET', waits .. sid, ARGV[16], 'PX', ARGV[8])
  local keep = tonumber(ARGV[8])
  if redis.call('PTTL', queue) < keep then
    redis.call('PEXPIRE', queue, keep)
  end
end
if not cur then
  if may_take(sid, queue, waits, nextkey, channel, grace, wait and ARGV[9] or nil) then
    return {1, grant(seat, KEYS[2], queue, nextkey, sid, ARGV[2], ARGV[3], ARGV[4], ARGV[10], channel, waits)}
  end
elseif wait then
  tell(seat, cur, false, ARGV[9], ARGV[14], ARGV[15])
end
local rank = -1
if wait then
  for _, other in ipairs(redis.call('ZRANGE', queue, 0, 7)) do
    if other == sid then break end
    if redis.call('EXISTS', waits .. other) == 0 then
      redis.call('ZREM', queue, other)
    end
  end
  rank = redis.call('ZRANK', queue, sid) or -1
end
return {0, redis.call('PTTL', seat), rank}
"#;

/// Take each free seat of a batch that is not kept for a waiter (or one already this
/// session's), as [`ACQUIRE`] does without waiting, in one call.
///
/// KEYS: session, then seat, counter, queue, reservation for each seat. ARGV: session
/// id, TTL ms, how long a free seat is kept for the waiter woken (ms), then candidate
/// id, value, seat terms, channel, waiter liveness key prefix for each seat.
///
/// Returns `{-1}` if the session is gone, else one entry per seat: the token of a grant,
/// or `0` if someone else holds the seat or waits for it.
const ACQUIRE_MANY: &str = r#"
local sid = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1} end
local out = {}
for i = 0, (#KEYS - 1) / 4 - 1 do
  local seat, counter, queue, nextkey = KEYS[2 + 4 * i], KEYS[3 + 4 * i], KEYS[4 + 4 * i], KEYS[5 + 4 * i]
  local a = 4 + 5 * i
  local cur = redis.call('GET', seat)
  local take
  if cur then
    take = string.sub(cur, 1, #sid + 1) == sid .. '\n'
  else
    take = may_take(sid, queue, ARGV[a + 4], nextkey, ARGV[a + 3], ARGV[3], nil)
  end
  if take then
    out[i + 1] = grant(seat, counter, queue, nextkey, sid, ARGV[2],
      ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
  else
    out[i + 1] = 0
  end
end
return out
"#;

/// The release of a seat, shared by the release scripts: delete the seat if session
/// `sid` holds it (with token `token`, or any if empty) and wake the best live waiter,
/// keeping the seat for it; leave the queue (passing the seat on if it was kept for this
/// session). Returns 1 if the seat was freed, else 0.
const UNSEAT: &str = r#"
local function unseat(seat, queue, nextkey, sid, token, channel, waits, grace)
  local p = sid .. '\n'
  if token ~= '' then p = p .. token .. '\n' end
  local cur = redis.call('GET', seat)
  if cur and string.sub(cur, 1, #p) == p then
    redis.call('ZREM', queue, sid)
    redis.call('DEL', waits .. sid)
    redis.call('DEL', seat)
    wake_next(queue, channel, waits, nextkey, grace)
    return 1
  end
  leave(seat, queue, nextkey, sid, channel, waits, grace)
  return 0
end
"#;

/// Release one seat (see [`UNSEAT`]).
///
/// KEYS: seat, queue, reservation. ARGV: session id, token or "", channel, waiter
/// liveness key prefix, how long a free seat is kept for the waiter woken (ms).
/// Returns 1 if the seat was freed, else 0.
const RELEASE: &str = r#"
return unseat(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
"#;

/// Release each seat of a batch (see [`UNSEAT`]) in one call.
///
/// KEYS: seat, queue, reservation for each seat. ARGV: session id, how long a free seat
/// is kept for the waiter woken (ms), then token or "", channel, waiter liveness key
/// prefix for each seat. Returns the number of seats freed.
const RELEASE_MANY: &str = r#"
local freed = 0
for i = 0, #KEYS / 3 - 1 do
  local a = 3 + 3 * i
  freed = freed + unseat(KEYS[1 + 3 * i], KEYS[2 + 3 * i], KEYS[3 + 3 * i], ARGV[1],
    ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[2])
end
return freed
"#;

/// A campaign given up (its future dropped): leave the queue, and pass the seat on if
/// it was kept for this session.
///
/// KEYS: seat, queue, reservation. ARGV: session id, channel, waiter liveness key
/// prefix, how long a free seat is kept for the waiter woken (ms).
const LEAVE: &str = r#"
leave(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
return 1
"#;

/// Renew the session and every seat it holds, in one call.
///
/// KEYS: session, seat 1…n. ARGV: TTL ms, session id, token 1…n.
/// Returns -1 if the session is gone, else the 1-based positions of the seats that are
/// gone or held by someone else (those are not touched), and the negated positions of
/// the seats renewed whose holder was told to give them up (a preemption or a handover
/// it may not have heard: pub/sub does not keep messages for a subscriber that is away).
const RENEW: &str = r#"
if redis.call('PEXPIRE', KEYS[1], ARGV[1]) == 0 then return -1 end
local out = {}
for i = 2, #KEYS do
  local p = ARGV[2] .. '\n' .. ARGV[i + 1] .. '\n'
  local cur = redis.call('GET', KEYS[i])
  if cur and string.sub(cur, 1, #p) == p then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    if string.find(cur, '^prio %-?%d+ [01] 1\n', #p + 1) then
      out[#out + 1] = 1 - i
    end
  else
    out[#out + 1] = i - 1
  end
end
return out
"#;

/// End a session: delete its key, free every listed seat it holds (waking the next
/// waiter) and leave every listed queue.
///
/// KEYS: session, then seat, queue and reservation of each election. ARGV: session id,
/// how long a free seat is kept for the waiter woken (ms), then the channel and the
/// waiter liveness key prefix of each election.
const CLOSE: &str = r#"
redis.call('DEL', KEYS[1])
for i = 0, (#KEYS - 1) / 3 - 1 do
  unseat(KEYS[2 + 3 * i], KEYS[3 + 3 * i], KEYS[4 + 3 * i], ARGV[1], '',
    ARGV[3 + 2 * i], ARGV[4 + 2 * i], ARGV[2])
end
return 1
"#;

/// Ask the holder of a seat to step down (a handover): to the waiter whose candidate
/// id is `to`, which moves to the head of the queue (below every priority's band), or
/// with "" to the best waiter; tell the holder as for a preemption, also one that may
/// not be preempted (unless it was told already).
///
/// KEYS: seat, queue. ARGV: `to` or "", waiter liveness key prefix, session channel
/// prefix, election. Returns `{1, seat value}`, or `{0, why}` with why `nobody leads`,
/// `nobody waits` or `no such waiter` (nothing changed then).
const HANDOVER: &str = r#"
local cur = redis.call('GET', KEYS[1])
if not cur then return {0, 'nobody leads'} end
local to = ARGV[1]
if to == '' then
  if not live_head(KEYS[2], ARGV[2]) then return {0, 'nobody waits'} end
else
  local found
  for _, s in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local tag = redis.call('GET', ARGV[2] .. s)
    if tag and string.match(tag, '^%S+ %S+ (.*)$') == to then
      found = s
      break
    end
  end
  if not found then return {0, 'no such waiter'} end
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local low = math.min(tonumber(first[2]) or 0, 0) - 1
  redis.call('ZADD', KEYS[2], num(low), found)
end
tell(KEYS[1], cur, true, 0, ARGV[3], ARGV[4])
return {1, cur}
"#;

/// Read a seat: `{PTTL, value or nil}`.
const READ: &str = r#"
return {redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1])}
"#;

/// What the generic scripts share: the reading of an election.
///
/// An election `E` is one hash: field `#rev` its revision, `#left` the bytes kept for
/// its next grant, and one field per record, named by its session id:
/// `<arrival>\n<version>\n<token or empty>\n<body>`. A record is live while its
/// session's key exists.
const ELECTION: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local function num(x) return string.format('%.0f', x) end
local sessions = ARGV[1]
local function fields(v)
  return string.match(v, '^(%d*)\n(%d*)\n(%d*)\n(.*)$')
end
-- {revision, left, then session, arrival, version, token, the session's PTTL, body for
-- each record}
local function snapshot(h)
  local all = redis.call('HGETALL', h)
  local out = {0, ''}
  for i = 1, #all, 2 do
    local k, v = all[i], all[i + 1]
    if k == '#rev' then out[1] = tonumber(v)
    elseif k == '#left' then out[2] = v
    else
      local a, ver, tok, body = fields(v)
      if a then
        local n = #out
        out[n + 1] = k
        out[n + 2] = a
        out[n + 3] = ver
        out[n + 4] = tok
        out[n + 5] = redis.call('PTTL', sessions .. k)
        out[n + 6] = body
      end
    end
  end
  return out
end
"#;

/// Read elections.
///
/// KEYS: the election hashes. ARGV: the session key prefix. Returns one snapshot (see
/// `ELECTION`) per key.
const READ_MANY: &str = r#"
local out = {}
for e = 1, #KEYS do out[e] = snapshot(KEYS[e]) end
return out
"#;

/// Commit writes, each atomically and only if its election is still at the revision it
/// was decided on and every session it puts or touches lives; a committed write moves
/// the election's revision on and publishes `<revision> <op>:<session>…` on the
/// election's channel (op `p` put, `m` put with a new token, `t` touch, `d` delete).
/// New tokens are the server time in µs, or one more than the last token minted if that
/// is not below it (the counter is store-wide, so tokens only increase).
///
/// KEYS: the token counter, then the election hashes. ARGV: the session key prefix,
/// then per election: its channel, the revision, `-` (keep what is left), `=` (clear
/// it) or `=<bytes>` (keep these), the number of ops, then four per op: kind, session,
/// token (kept, or empty), body. Returns `{committed 1/0, snapshot after}` per election.
const COMMIT_MANY: &str = r#"
local function mint()
  local t = redis.call('TIME')
  local now_s = t[1] .. string.format('%06d', tonumber(t[2]))
  local now = tonumber(now_s)
  local last = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
  if last >= now then return num(redis.call('INCR', KEYS[1])) end
  redis.call('SET', KEYS[1], now_s)
  return now_s
end
local out = {}
local i = 2
for e = 2, #KEYS do
  local h, channel, expect, left = KEYS[e], ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local first = i + 4
  i = first + 4 * tonumber(ARGV[i + 3])
  local rev = tonumber(redis.call('HGET', h, '#rev') or '0')
  local ok = rev == expect
  for o = first, i - 1, 4 do
    if ok and ARGV[o] ~= 'd' and redis.call('EXISTS', sessions .. ARGV[o + 1]) == 0 then
      ok = false
    end
  end
  if ok then
    local r = num(rev + 1)
    redis.call('HSET', h, '#rev', r)
    if left == '=' then redis.call('HDEL', h, '#left')
    elseif left ~= '-' then redis.call('HSET', h, '#left', string.sub(left, 2)) end
    local said = {r}
    for o = first, i - 1, 4 do
      local kind, sid = ARGV[o], ARGV[o + 1]
      local cur = redis.call('HGET', h, sid)
      local a, ver, tok, body
      if cur then a, ver, tok, body = fields(cur) end
      if kind == 'd' then
        redis.call('HDEL', h, sid)
      elseif kind == 't' then
        if a then redis.call('HSET', h, sid, a .. '\n' .. r .. '\n' .. tok .. '\n' .. body) end
      else
        local t = ARGV[o + 2]
        if kind == 'm' then t = mint() end
        redis.call('HSET', h, sid, (a or r) .. '\n' .. r .. '\n' .. t .. '\n' .. ARGV[o + 3])
      end
      said[#said + 1] = kind .. ':' .. sid
    end
    redis.call('PUBLISH', channel, table.concat(said, ' '))
  end
  out[#out + 1] = {ok and 1 or 0, snapshot(h)}
end
return out
"#;

/// Renew sessions: each session key holds its TTL in ms.
///
/// KEYS: the session keys. Returns 1 per session renewed, 0 per session gone.
const RENEW_SESSIONS: &str = r#"
local out = {}
for i = 1, #KEYS do
  local ttl = redis.call('GET', KEYS[i])
  out[i] = (ttl and redis.call('PEXPIRE', KEYS[i], ttl) == 1) and 1 or 0
end
return out
"#;

/// Register (or replace) a member of a namespace for a session, if the session lives;
/// publish on the namespace's channel when the entry changed. An entry is
/// `session id \n version \n value`; the version comes from the hash's counter field
/// `#v` (never a member id), so a watcher can tell a changed entry without its value.
///
/// KEYS: session, members hash. ARGV: session id, member id, value, channel.
/// Returns -1 if the session is gone, 1 if the entry changed, 0 if it was already so.
const REGISTER: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local cur = redis.call('HGET', KEYS[2], ARGV[2])
local p = ARGV[1] .. '\n'
if cur and string.sub(cur, 1, #p) == p then
  local rest = string.sub(cur, #p + 1)
  local nl = string.find(rest, '\n', 1, true)
  if nl and string.sub(rest, nl + 1) == ARGV[3] then return 0 end
end
local version = redis.call('HINCRBY', KEYS[2], '#v', 1)
redis.call('HSET', KEYS[2], ARGV[2], p .. version .. '\n' .. ARGV[3])
redis.call('PUBLISH', ARGV[4], 'members')
return 1
"#;

/// Remove a session's members of a namespace (entries another session registered
/// later under the same id stay); publish if any went.
///
/// KEYS: members hash. ARGV: session id, channel, then the member ids, or none for every
/// member of the session. Returns how many entries went.
const UNREGISTER: &str = r#"
local p = ARGV[1] .. '\n'
local ids = {}
if #ARGV > 2 then
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do ids[#ids + 1] = all[i] end
end
local n = 0
for _, id in ipairs(ids) do
  local cur = redis.call('HGET', KEYS[1], id)
  if cur and string.sub(cur, 1, #p) == p then
    redis.call('HDEL', KEYS[1], id)
    n = n + 1
  end
end
if n > 0 then redis.call('PUBLISH', ARGV[2], 'members') end
return n
"#;

/// List a namespace's live members: those whose session key still exists. Entries of
/// sessions that are gone are deleted on the way (nobody is told: watchers look again
/// at the expiry they were given). A caller names the entries it already has, by id and
/// version, and gets those without their values, so a watcher's look after a change
/// carries the changed values only.
///
/// KEYS: members hash. ARGV: the session key prefix, then pairs of id and version known.
/// Returns `{earliest PTTL of a live member's session in ms or -1, then id, version,
/// value or nil when known, for each member}`.
const LIST: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local known = {}
for i = 2, #ARGV - 1, 2 do known[ARGV[i]] = ARGV[i + 1] end
local all = redis.call('HGETALL', KEYS[1])
local ttls = {}
local out = {-1}
local earliest = -1
for i = 1, #all, 2 do
  local id, v = all[i], all[i + 1]
  local nl = string.find(v, '\n', 1, true)
  if nl then
    local sid = string.sub(v, 1, nl - 1)
    local ttl = ttls[sid]
    if ttl == nil then
      ttl = redis.call('PTTL', ARGV[1] .. sid)
      ttls[sid] = ttl
    end
    if ttl == -2 then
      redis.call('HDEL', KEYS[1], id)
    else
      if ttl >= 0 and (earliest < 0 or ttl < earliest) then earliest = ttl end
      local version = ''
      local nl2 = string.find(v, '\n', nl + 1, true)
      if nl2 then version = string.sub(v, nl + 1, nl2 - 1) else nl2 = nl end
      out[#out + 1] = id
      out[#out + 1] = version
      if version ~= '' and known[id] == version then
        out[#out + 1] = false
      else
        out[#out + 1] = string.sub(v, nl2 + 1)
      end
    end
  end
end
out[1] = earliest
return out
"#;

pub(crate) static ACQUIRE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{COMMON}{GRANT}{ACQUIRE}")));
pub(crate) static ACQUIRE_MANY_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{COMMON}{GRANT}{ACQUIRE_MANY}")));
pub(crate) static RELEASE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{COMMON}{UNSEAT}{RELEASE}")));
pub(crate) static RELEASE_MANY_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{COMMON}{UNSEAT}{RELEASE_MANY}")));
pub(crate) static LEAVE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{COMMON}{LEAVE}")));
pub(crate) static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW));
pub(crate) static CLOSE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{COMMON}{UNSEAT}{CLOSE}")));
pub(crate) static HANDOVER_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{COMMON}{GRANT}{HANDOVER}")));
pub(crate) static READ_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(READ));
pub(crate) static REGISTER_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(REGISTER));
pub(crate) static UNREGISTER_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(UNREGISTER));
pub(crate) static LIST_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(LIST));
pub(crate) static READ_MANY_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{ELECTION}{READ_MANY}")));
pub(crate) static COMMIT_MANY_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{ELECTION}{COMMIT_MANY}")));
pub(crate) static RENEW_SESSIONS_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(RENEW_SESSIONS));
