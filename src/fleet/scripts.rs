//! The Lua scripts: each decision on shared state is one script, atomic in Redis, timed by
//! Redis's `TIME` (so the workers' own clocks never enter a decision). Numbers are written with
//! `%d`: Lua's default conversion keeps 14 digits, and a microsecond clock has 16.

use std::sync::LazyLock;

/// The budget's sync: deposit a batch, give back or take a lease, keep the cap fleet-wide.
///
/// What sits in leases counts against the cap: the script keeps `leased`, the sum of every live
/// worker's lease (each worker reports what it still holds; what it spent is gone), and holds
/// `balance + leased <= cap`. A worker not heard from for the lease TTL is taken for dead: its
/// lease leaves `leased` (those retries are lost, and the cap is free again).
///
/// **Once per sync.** A sync that got no answer (a timeout: Redis may run it late) is sent again
/// with the same id; the script remembers, per lease, the last id it applied and its answer, and
/// answers a repeated id from memory without applying it again (the ms left in the floor window
/// recomputed). The exact path sends no id: it is never sent twice.
///
/// `KEYS`: 1 the budget's hash, 2 the leases by worker (hash), 3 when each worker was last heard
/// from (sorted set), 4 this lease's last sync (hash). `ARGV`: 1 milli-retries deposited, 2
/// milli-retries given back, 3 milli-retries wanted, 4 floor uses wanted, 5 the cap (milli), 6
/// floor uses per window, 7 the floor window (ms), 8 `exact`: take the floor only if the balance
/// could not pay what was wanted, 9 this worker, 10 milli-retries it still holds (after its give
/// back), 11 the lease TTL (ms), 12 the sync's id (empty: not remembered), 13 `1` when the lease
/// closes (its memory is dropped: nothing follows). Returns `{granted milli, granted floor uses,
/// balance after (milli), ms left in the floor window}`. The cap, the floor and the window are
/// kept in the budget's hash too, for [`status`](super::status).
pub(super) static BUDGET: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[12] ~= '' then
  local last = redis.call('HMGET', KEYS[4], 'id', 'grant', 'floor', 'bal', 'wend')
  if last[1] == ARGV[12] then
    return {tonumber(last[2]), tonumber(last[3]), tonumber(last[4]), math.max(0, tonumber(last[5]) - now)}
  end
end
local st = redis.call('HMGET', KEYS[1], 'balance', 'window', 'used', 'leased')
local leased = tonumber(st[4] or '0')
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[11]), 'LIMIT', 0, 100)
for _, w in ipairs(dead) do
  if w ~= ARGV[9] then
    leased = leased - tonumber(redis.call('HGET', KEYS[2], w) or '0')
    redis.call('HDEL', KEYS[2], w)
    redis.call('ZREM', KEYS[3], w)
  end
end
local held = tonumber(ARGV[10])
leased = math.max(0, leased - tonumber(redis.call('HGET', KEYS[2], ARGV[9]) or '0') + held)
local cap = tonumber(ARGV[5])
local bal = tonumber(st[1] or '0') + tonumber(ARGV[1]) + tonumber(ARGV[2])
bal = math.max(0, math.min(bal, cap - leased))
local want = tonumber(ARGV[3])
local grant = 0
if want > 0 and bal > 0 then
  grant = math.min(want, bal)
  if ARGV[8] == '1' and grant < want then grant = 0 end
  bal = bal - grant
end
if ARGV[8] ~= '1' then
  leased = leased + grant
  held = held + grant
end
local width = tonumber(ARGV[7])
local window = math.floor(now / width)
local used = tonumber(st[3] or '0')
if tonumber(st[2] or '-1') ~= window then used = 0 end
local floor_grant = 0
local want_floor = tonumber(ARGV[4])
if ARGV[8] == '1' and grant > 0 then want_floor = 0 end
if want_floor > 0 then
  floor_grant = math.max(0, math.min(want_floor, tonumber(ARGV[6]) - used))
  used = used + floor_grant
end
redis.call('HSET', KEYS[1], 'balance', string.format('%d', bal), 'window', string.format('%d', window), 'used', string.format('%d', used), 'leased', string.format('%d', leased), 'cap', ARGV[5], 'floor', ARGV[6], 'width', ARGV[7])
if held > 0 then
  redis.call('HSET', KEYS[2], ARGV[9], string.format('%d', held))
else
  redis.call('HDEL', KEYS[2], ARGV[9])
end
redis.call('ZADD', KEYS[3], now, ARGV[9])
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], 86400000) end
local wend = (window + 1) * width
if ARGV[13] == '1' then
  redis.call('DEL', KEYS[4])
elseif ARGV[12] ~= '' then
  redis.call('HSET', KEYS[4], 'id', ARGV[12], 'grant', string.format('%d', grant), 'floor', string.format('%d', floor_grant), 'bal', string.format('%d', bal), 'wend', string.format('%d', wend))
  redis.call('PEXPIRE', KEYS[4], 86400000)
end
return {grant, floor_grant, bal, wend - now}
"#,
    )
});

/// GCRA in Redis: reserve `cost` units and say how long until they may go.
///
/// `KEYS[1]` the key's theoretical arrival time (µs on Redis's clock). `ARGV`: 1 the interval
/// (µs per unit), 2 the burst's tolerance (µs), 3 the cost. Returns the wait in µs. The key
/// expires once the quota is full again: an idle tenant costs Redis nothing.
pub(super) static QUOTA: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local base = math.max(tat, now)
local nxt = base + interval * tonumber(ARGV[3])
local wait = math.max(0, nxt - tolerance - interval - now)
redis.call('SET', KEYS[1], string.format('%d', nxt), 'PX', math.floor((nxt - now) / 1000) + 1000)
return wait
"#,
    )
});

/// A breaker's sync: count a batch, publish a local trip, lease the half-open trial.
///
/// Once per sync, as the budget's: a repeated id (a sync sent again after a timeout) is answered
/// from this breaker's memory of its last sync, not counted again.
///
/// `KEYS[1]` the breaker's hash, `KEYS[2]` its trial lease, `KEYS[3]` this worker's breaker's last
/// sync (hash). `ARGV`: 1 successes, 2 failures, 3
/// the failures in a row at the batch's end, 4 `1` if this worker's breaker opened by itself
/// (a trip or a failed trial) since the last sync, 5 `1` if this worker's trial succeeded, 6
/// failures in a row that open the fleet's breaker, 7 the open time (ms), 8 the trial lease
/// (ms), 9 this worker, 10 `1` if a call came to this worker's open breaker since the last sync
/// (only a worker with traffic takes the trial lease), 11 `1` if this worker's breaker is
/// half-open (its trial is under way: it keeps the lease; a holder with neither gives it up), 12
/// the sync's id.
/// Returns `{open (0/1), ms until a trial may go, 1 if this worker holds
/// the trial, generation}`.
pub(super) static BREAKER: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = redis.call('HMGET', KEYS[3], 'id', 'open', 'until', 'mine', 'gen')
if last[1] == ARGV[12] then
  return {tonumber(last[2]), math.max(0, tonumber(last[3]) - now), tonumber(last[4]), tonumber(last[5])}
end
local st = redis.call('HMGET', KEYS[1], 'open', 'until', 'run', 'gen')
local open = tonumber(st[1] or '0')
local untl = tonumber(st[2] or '0')
local run = tonumber(st[3] or '0')
local gen = tonumber(st[4] or '0')
local s, f, tail = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local me = ARGV[9]
local holder = redis.call('GET', KEYS[2])
if open == 1 and ARGV[5] == '1' and holder == me then
  open = 0; run = 0; gen = gen + 1
  redis.call('DEL', KEYS[2]); holder = false
elseif open == 0 then
  if s > 0 then run = tail else run = run + f end
  if run >= tonumber(ARGV[6]) or ARGV[4] == '1' then
    open = 1; untl = now + tonumber(ARGV[7]); run = 0; gen = gen + 1
  end
elseif ARGV[4] == '1' then
  untl = now + tonumber(ARGV[7])
  if holder == me then redis.call('DEL', KEYS[2]); holder = false end
end
local mine = 0
if open == 1 and now >= untl then
  if holder == me then
    if ARGV[10] == '1' or ARGV[11] == '1' then mine = 1 else redis.call('DEL', KEYS[2]) end
  elseif not holder and ARGV[10] == '1' then
    if redis.call('SET', KEYS[2], me, 'NX', 'PX', tonumber(ARGV[8])) then mine = 1 end
  end
end
redis.call('HSET', KEYS[1], 'open', open, 'until', string.format('%d', untl), 'run', string.format('%d', run), 'gen', gen)
redis.call('PEXPIRE', KEYS[1], 86400000)
redis.call('HSET', KEYS[3], 'id', ARGV[12], 'open', open, 'until', string.format('%d', untl), 'mine', mine, 'gen', gen)
redis.call('PEXPIRE', KEYS[3], 86400000)
return {open, math.max(0, untl - now), mine, gen}
"#,
    )
});

/// What a budget's keys hold, read only (for [`status`](super::status)).
///
/// `KEYS` as [`BUDGET`]'s first three; `ARGV[1]` the lease TTL (ms). Returns `{balance, leased,
/// floor uses in the current window, floor uses per window, the window (ms), ms left in it, the
/// cap, the leases as a flat list of worker and milli-retries, the live workers}`.
pub(super) static BUDGET_STATUS: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local st = redis.call('HMGET', KEYS[1], 'balance', 'leased', 'window', 'used', 'floor', 'width', 'cap')
local width = tonumber(st[6] or '0')
local used, left = 0, 0
if width > 0 then
  local window = math.floor(now / width)
  if tonumber(st[3] or '-1') == window then used = tonumber(st[4] or '0') end
  left = (window + 1) * width - now
end
local live = redis.call('ZRANGEBYSCORE', KEYS[3], now - tonumber(ARGV[1]), '+inf')
return {tonumber(st[1] or '0'), tonumber(st[2] or '0'), used, tonumber(st[5] or '0'), width, left, tonumber(st[7] or '0'), redis.call('HGETALL', KEYS[2]), live}
"#,
    )
});

/// What a breaker's keys hold, read only (for [`status`](super::status)).
///
/// `KEYS` as [`BREAKER`]'s first two. Returns `{open (0/1), ms until a trial may go, failures in a
/// row, generation, the trial's holder (empty: none)}`.
pub(super) static BREAKER_STATUS: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local st = redis.call('HMGET', KEYS[1], 'open', 'until', 'run', 'gen')
local holder = redis.call('GET', KEYS[2]) or ''
return {tonumber(st[1] or '0'), math.max(0, tonumber(st[2] or '0') - now), tonumber(st[3] or '0'), tonumber(st[4] or '0'), holder}
"#,
    )
});
