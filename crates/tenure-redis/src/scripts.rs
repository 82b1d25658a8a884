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
local t = redis.call('TIME')
local now_s = t[1] .. string.format('%06d', tonumber(t[2]))
local now = tonumber(now_s)
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local token
if last >= now then
  token = redis.call('INCR', KEYS[2])
else
  redis.call('SET', KEYS[2], now_s)
  token = now
end
local token_s = string.format('%.0f', token)
redis.call('SET', KEYS[1], sid .. '\n' .. token_s .. '\n' .. ARGV[3] .. '\n' .. ARGV[4], 'PX', ARGV[2])
redis.call('ZREM', KEYS[3], sid)
redis.call('DEL', ARGV[7] .. sid)
redis.call('PUBLISH', ARGV[6], 'taken ' .. token_s)
return {1, token_s}
"#;

/// Delete the seat if this session holds it (with the given token, or any if empty),
/// leave the queue, and wake the next live waiter.
///
/// KEYS: seat, queue. ARGV: session id, token or "", channel, waiter liveness key prefix.
/// Returns 1 if the seat was freed, else 0.
const RELEASE: &str = r#"
local sid = ARGV[1]
redis.call('ZREM', KEYS[2], sid)
redis.call('DEL', ARGV[4] .. sid)
local p = sid .. '\n'
if ARGV[2] ~= '' then p = p .. ARGV[2] .. '\n' end
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, #p) == p then
  redis.call('DEL', KEYS[1])
  wake_next(KEYS[2], ARGV[3], ARGV[4])
  return 1
end
return 0
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

pub(crate) static ACQUIRE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{COMMON}{ACQUIRE}")));
pub(crate) static RELEASE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{COMMON}{RELEASE}")));
pub(crate) static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW));
pub(crate) static CLOSE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{COMMON}{CLOSE}")));
pub(crate) static READ_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(READ));
