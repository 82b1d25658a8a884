//! The Lua scripts, each atomic in Redis. They decide nothing about an election (the
//! engine does): the commit script applies its conditional writes in one round trip.
//! Scripts touch keys not passed in `KEYS` (the records' session keys), so they need a
//! single Redis primary (not Redis Cluster).

use std::sync::LazyLock;

use redis::Script;

/// The reading of an election hash (its layout is in the crate README), shared by the
/// read and commit scripts. A record is live while its session's key exists.
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
/// was decided on and every session it puts or touches lives; a committed write
/// publishes the election as it leaves it (its hash key, then its snapshot, each field
/// as `<length>:<bytes>`) on the election's channel and on the channel of each session
/// in it or written for. A new token is `max(last + 1, server time in µs)`.
///
/// KEYS: the token counter, then the election hashes. ARGV: the session key prefix, the
/// session channel prefix, then per election: its channel, the revision, `-` (keep what
/// is left), `=` (clear it) or `=<bytes>` (keep these), the number of ops, then four per
/// op: kind (`p` put, `m` put with a new token, `t` touch, `d` delete), session, token
/// (kept, or empty), body. Returns `{committed 1/0, snapshot
/// after}` per election.
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
local function pack(h, snap)
  local parts = {#h .. ':' .. h}
  for n = 1, #snap do
    local v = snap[n]
    if type(v) == 'number' then v = num(v) end
    parts[n + 1] = #v .. ':' .. v
  end
  return table.concat(parts)
end
local out = {}
local i = 3
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
    end
  end
  local snap = snapshot(h)
  if ok then
    local body = pack(h, snap)
    redis.call('PUBLISH', channel, body)
    local to = {}
    for o = first, i - 1, 4 do to[ARGV[o + 1]] = true end
    for n = 3, #snap, 6 do to[snap[n]] = true end
    for sid in pairs(to) do redis.call('PUBLISH', ARGV[2] .. sid, body) end
  end
  out[#out + 1] = {ok and 1 or 0, snap}
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
/// publish on the namespace's channel when the entry changed. The entry's version
/// comes from the hash's counter `#v`, so a watcher can tell a changed entry by it.
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

/// List a namespace's live members (whose session key exists), deleting the others on
/// the way (unannounced: watchers look again at the expiry they were given). Entries
/// the caller names by id and version come without their values.
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

pub(crate) static READ_MANY_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{ELECTION}{READ_MANY}")));
pub(crate) static COMMIT_MANY_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{ELECTION}{COMMIT_MANY}")));
pub(crate) static RENEW_SESSIONS_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(RENEW_SESSIONS));
pub(crate) static REGISTER_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(REGISTER));
pub(crate) static UNREGISTER_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(UNREGISTER));
pub(crate) static LIST_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(LIST));
