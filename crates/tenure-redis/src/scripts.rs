//! The Lua scripts. Each runs atomically in Redis, so every decision about a seat is
//! made and applied in one round trip.
//!
//! Scripts name keys that are not passed in `KEYS` (the liveness keys of queued
//! waiters), so they need a single Redis primary (not Redis Cluster).

use std::sync::LazyLock;

use redis::Script;

/// Helpers shared by the scripts that free a seat.
const COMMON: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
-- Wake the first waiter still waiting (its liveness key `waits .. session` is renewed
-- by each of its attempts), forgetting the others on the way.
local function wake_next(queue, channel, waits)
  for _ = 1, 16 do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then break end
    if redis.call('EXISTS', waits .. head) == 1 then
      redis.call('PUBLISH', channel, 'free ' .. head)
      return
    end
    redis.call('ZREM', queue, head)
  end
  redis.call('PUBLISH', channel, 'free')
end
"#;

/// The grant of a seat, shared by the acquire scripts: mint the next token (see
/// [`ACQUIRE`]), write the seat for the session's TTL, leave the queue, and announce it.
/// Returns the token as text.
const GRANT: &str = r#"
local function grant(seat, counter, queue, sid, ttl, id, value, channel, waits)
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
  local token_s = string.format('%.0f', token)
  redis.call('SET', seat, sid .. '\n' .. token_s .. '\n' .. id .. '\n' .. value, 'PX', ttl)
  redis.call('ZREM', queue, sid)
  redis.call('DEL', waits .. sid)
  redis.call('PUBLISH', channel, 'taken ' .. token_s)
  return token_s
end
"#;

/// Take the seat if it is free (or already this session's), minting the next token;
/// else, when waiting, join the queue.
///
/// KEYS: seat, counter, queue, session. ARGV: session id, TTL ms, candidate id, value,
/// wait ("1"/"0"), channel, waiter liveness key prefix, how long a waiter's place is kept
/// without an attempt (ms).
///
/// Returns `{-1}` if the session is gone, `{1, token}` on a grant, `{0, seat PTTL,
/// queue rank or -1}` if someone else holds it.
///
/// The token is `max(counter + 1, now)` with `now` the server's `TIME` in microseconds
/// since 1970: a counter that Redis lost (restart without persistence) or that lags
/// (failover to a replica that missed writes) still continues above every token handed
/// out before, as long as the server's clock is later than it was at the last grant. (A
/// grant takes more than a microsecond, so tokens never run ahead of the clock.)
const ACQUIRE: &str = r#"
local sid = ARGV[1]
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('ZREM', KEYS[3], sid)
  redis.call('DEL', ARGV[7] .. sid)
  return {-1}
end
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, #sid + 1) ~= sid .. '\n' then
  local rank = -1
  if ARGV[5] == '1' then
    local t = redis.call('TIME')
    redis.call('ZADD', KEYS[3], 'NX', t[1] .. string.format('%06d', tonumber(t[2])), sid)
    redis.call('SET', ARGV[7] .. sid, '1', 'PX', ARGV[8])
    for _, other in ipairs(redis.call('ZRANGE', KEYS[3], 0, 7)) do
      if other == sid then break end
      if redis.call('EXISTS', ARGV[7] .. other) == 0 then
        redis.call('ZREM', KEYS[3], other)
      end
    end
    rank = redis.call('ZRANK', KEYS[3], sid) or -1
    local keep = tonumber(ARGV[8])
    if redis.call('PTTL', KEYS[3]) < keep then
      redis.call('PEXPIRE', KEYS[3], keep)
    end
  end
  return {0, redis.call('PTTL', KEYS[1]), rank}
end
return {1, grant(KEYS[1], KEYS[2], KEYS[3], sid, ARGV[2], ARGV[3], ARGV[4], ARGV[6], ARGV[7])}
"#;

/// Take each free seat of a batch (or one already this session's), as [`ACQUIRE`] does
/// without waiting, in one call.
///
/// KEYS: session, then seat, counter, queue for each seat. ARGV: session id, TTL ms,
/// then candidate id, value, channel, waiter liveness key prefix for each seat.
///
/// Returns `{-1}` if the session is gone, else one entry per seat: the token of a grant,
/// or `0` if someone else holds the seat.
const ACQUIRE_MANY: &str = r#"
local sid = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1} end
local out = {}
for i = 0, (#KEYS - 1) / 3 - 1 do
  local seat, a = KEYS[2 + 3 * i], 3 + 4 * i
  local cur = redis.call('GET', seat)
  if cur and string.sub(cur, 1, #sid + 1) ~= sid .. '\n' then
    out[i + 1] = 0
  else
    out[i + 1] = grant(seat, KEYS[3 + 3 * i], KEYS[4 + 3 * i], sid, ARGV[2],
      ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
  end
end
return out
"#;

/// The release of a seat, shared by the release scripts: delete the seat if session
/// `sid` holds it (with token `token`, or any if empty), leave the queue, and wake the
/// next live waiter. Returns 1 if the seat was freed, else 0.
const UNSEAT: &str = r#"
local function unseat(seat, queue, sid, token, channel, waits)
  redis.call('ZREM', queue, sid)
  redis.call('DEL', waits .. sid)
  local p = sid .. '\n'
  if token ~= '' then p = p .. token .. '\n' end
  local cur = redis.call('GET', seat)
  if cur and string.sub(cur, 1, #p) == p then
    redis.call('DEL', seat)
    wake_next(queue, channel, waits)
    return 1
  end
  return 0
end
"#;

/// Release one seat (see [`UNSEAT`]).
///
/// KEYS: seat, queue. ARGV: session id, token or "", channel, waiter liveness key prefix.
/// Returns 1 if the seat was freed, else 0.
const RELEASE: &str = r#"
return unseat(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
"#;

/// Release each seat of a batch (see [`UNSEAT`]) in one call.
///
/// KEYS: seat, queue for each seat. ARGV: session id, then token or "", channel, waiter
/// liveness key prefix for each seat. Returns the number of seats freed.
const RELEASE_MANY: &str = r#"
local freed = 0
for i = 0, #KEYS / 2 - 1 do
  local a = 2 + 3 * i
  freed = freed + unseat(KEYS[1 + 2 * i], KEYS[2 + 2 * i], ARGV[1], ARGV[a], ARGV[a + 1], ARGV[a + 2])
end
return freed
"#;

/// Renew the session and every seat it holds, in one call.
///
/// KEYS: session, seat 1…n. ARGV: TTL ms, session id, token 1…n.
/// Returns -1 if the session is gone, else the 1-based positions of the seats that are
/// gone or held by someone else (those are not touched).
const RENEW: &str = r#"
if redis.call('PEXPIRE', KEYS[1], ARGV[1]) == 0 then return -1 end
local lost = {}
for i = 2, #KEYS do
  local p = ARGV[2] .. '\n' .. ARGV[i + 1] .. '\n'
  local cur = redis.call('GET', KEYS[i])
  if cur and string.sub(cur, 1, #p) == p then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
  else
    lost[#lost + 1] = i - 1
  end
end
return lost
"#;

/// End a session: delete its key, free every listed seat it holds (waking the next
/// waiter) and leave every listed queue.
///
/// KEYS: session, then seat and queue of each election. ARGV: session id, then the
/// channel and the waiter liveness key prefix of each election.
const CLOSE: &str = r#"
redis.call('DEL', KEYS[1])
local sid = ARGV[1]
for i = 1, (#KEYS - 1) / 2 do
  local seat, queue = KEYS[2 * i], KEYS[2 * i + 1]
  local channel, waits = ARGV[2 * i], ARGV[2 * i + 1]
  redis.call('ZREM', queue, sid)
  redis.call('DEL', waits .. sid)
  local cur = redis.call('GET', seat)
  if cur and string.sub(cur, 1, #sid + 1) == sid .. '\n' then
    redis.call('DEL', seat)
    wake_next(queue, channel, waits)
  end
end
return 1
"#;

/// Read a seat: `{PTTL, value or nil}`.
const READ: &str = r#"
return {redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1])}
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
pub(crate) static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW));
pub(crate) static CLOSE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{COMMON}{CLOSE}")));
pub(crate) static READ_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(READ));
pub(crate) static REGISTER_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(REGISTER));
pub(crate) static UNREGISTER_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(UNREGISTER));
pub(crate) static LIST_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(LIST));
