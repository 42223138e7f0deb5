"""The Redis broker's fair queues: :mod:`.fair`'s rules as Lua scripts, so each step is atomic.

Keys of one queue, all under the queue's base name ``KEYS[1]`` (``<prefix>queue:<name>:``):

* ``users``     sorted set: backlogged user -> counter (the next hint comes from its first member);
* ``counters``  hash: user -> counter, idle users included (a returning user's counter is lifted);
* ``u:<user>``  list: that user's waiting message ids, oldest first;
* ``meta``      hash: message id -> ``"<cost> <user>"``;
* ``job``       hash: message id -> the job note pushed with its hint (only where one was given);
* ``served``    string: the counter of the user served last (the floor when nobody waits);
* ``len``       string: how many hints wait;
* ``wake``      list: one token per waiting hint not handed out at once (see below);
* ``idle``      sorted set: poppers blocked on their hand list -> when their wait ends (ms, Redis' clock);
* ``hand:<id>`` list: the one hint ``PUSH`` handed to the waiting popper ``<id>``.

A popper with nothing to pop registers in ``idle`` (``WAIT``) and BLPOPs its own hand list. A push
that finds a registered popper pops the next hint in fair order for it at once and hands it over:
the popper's wake-up and its pop are one step, as for the in-process broker's blocked poppers. A popper
whose wait ends unregisters (``STOP_WAITING``), taking a hint handed to it meanwhile. A popper that
vanished while registered (its replica died) may be handed one hint before its registration expires:
that hint is lost from the queue, and the recovery loop re-queues its message from the database.

Counters are written with ``%.17g`` so Lua's default ``%.14g`` number formatting never rounds them:
both brokers must compute the same order from the same pushes.
"""

from __future__ import annotations

_COMMON = """
local base = KEYS[1]
local function fmt(x) return string.format('%.17g', x) end
local function floor_counter()
    local first = redis.call('ZRANGE', base .. 'users', 0, 0, 'WITHSCORES')
    if #first > 0 then return tonumber(first[2]) end
    return tonumber(redis.call('GET', base .. 'served') or '0')
end
local function now_ms()
    local now = redis.call('TIME')
    return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
-- The next hint in fair order, {message id, job note or '', cost, user}, or false; with consume_wake,
-- a wake token goes with it.
local function pop_next(consume_wake)
    while true do
        local first = redis.call('ZRANGE', base .. 'users', 0, 0, 'WITHSCORES')
        if #first == 0 then
            redis.call('SET', base .. 'len', 0)
            redis.call('DEL', base .. 'wake')
            return false
        end
        local user, counter = first[1], tonumber(first[2])
        local list = base .. 'u:' .. user
        local msg = redis.call('LPOP', list)
        if msg then
            local cost = 0
            local meta = redis.call('HGET', base .. 'meta', msg)
            if meta then
                cost = tonumber(string.match(meta, '^(%S+)')) or 0
                redis.call('HDEL', base .. 'meta', msg)
            end
            local new_counter = counter + cost
            redis.call('SET', base .. 'served', fmt(counter))
            redis.call('HSET', base .. 'counters', user, fmt(new_counter))
            if redis.call('LLEN', list) > 0 then
                redis.call('ZADD', base .. 'users', fmt(new_counter), user)
            else
                redis.call('ZREM', base .. 'users', user)
            end
            if redis.call('DECR', base .. 'len') < 0 then redis.call('SET', base .. 'len', 0) end
            if consume_wake then redis.call('LPOP', base .. 'wake') end
            local job = redis.call('HGET', base .. 'job', msg)
            if job then redis.call('HDEL', base .. 'job', msg) end
            return {msg, job or '', fmt(cost), user}
        end
        redis.call('ZREM', base .. 'users', user)
    end
end
"""

# ARGV: message id, user, cost, credit, job note ("" for none), how long a hand entry is kept (ms)
PUSH = (
    _COMMON
    + """
local msg, user, cost, credit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if cost < 0 then cost = 0 end
if not redis.call('ZSCORE', base .. 'users', user) then
    local counter = tonumber(redis.call('HGET', base .. 'counters', user) or '0')
    local lifted = floor_counter() - credit
    if lifted > counter then counter = lifted end
    redis.call('HSET', base .. 'counters', user, fmt(counter))
    redis.call('ZADD', base .. 'users', fmt(counter), user)
end
redis.call('RPUSH', base .. 'u:' .. user, msg)
redis.call('HSET', base .. 'meta', msg, fmt(cost) .. ' ' .. user)
if ARGV[5] and ARGV[5] ~= '' then redis.call('HSET', base .. 'job', msg, ARGV[5]) end
redis.call('INCR', base .. 'len')
redis.call('ZREMRANGEBYSCORE', base .. 'idle', '-inf', now_ms())
local waiting = redis.call('ZPOPMIN', base .. 'idle')
if #waiting > 0 then
    -- A popper waits: it gets the next hint in fair order now, as a hand entry (the four fields of
    -- pop_next's reply joined by NULs; message and user ids are database ids, which hold no NUL).
    local hint = pop_next(false)
    local hand = base .. 'hand:' .. waiting[1]
    redis.call('RPUSH', hand, table.concat(hint, '\\0'))
    redis.call('PEXPIRE', hand, ARGV[6])
    return 1
end
redis.call('RPUSH', base .. 'wake', '1')
return 1
"""
)

# ARGV: "1" to consume a wake token. Returns {message id, job note or "", cost, user}, or false.
POP = _COMMON + "return pop_next(ARGV[1] == '1')\n"

# ARGV: popper id, how long it will wait (ms). The next hint if there is one (a wake token with it);
# else the popper is registered as waiting on its hand list. Returns as POP.
WAIT = (
    _COMMON
    + """
local hint = pop_next(true)
if hint then return hint end
redis.call('ZADD', base .. 'idle', now_ms() + tonumber(ARGV[2]), ARGV[1])
return false
"""
)

# ARGV: popper id. Unregisters it; returns the hint handed to it meanwhile (as a hand entry), or false.
STOP_WAITING = """
local base = KEYS[1]
redis.call('ZREM', base .. 'idle', ARGV[1])
return redis.call('LPOP', base .. 'hand:' .. ARGV[1])
"""

# ARGV: user, cost, credit. A job served at once, as PUSH and its pop would count it, if no hint waits
# (returns 1); else nothing changes (returns 0).
SERVE_NOW = (
    _COMMON
    + """
if redis.call('ZCARD', base .. 'users') > 0 then return 0 end
local user, cost, credit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if cost < 0 then cost = 0 end
local counter = tonumber(redis.call('HGET', base .. 'counters', user) or '0')
local lifted = floor_counter() - credit
if lifted > counter then counter = lifted end
redis.call('SET', base .. 'served', fmt(counter))
redis.call('HSET', base .. 'counters', user, fmt(counter + cost))
return 1
"""
)

# ARGV: message id
REMOVE = """
local base = KEYS[1]
local meta = redis.call('HGET', base .. 'meta', ARGV[1])
if not meta then return 0 end
local user = string.match(meta, '^%S+ (.*)$') or ''
local list = base .. 'u:' .. user
local removed = redis.call('LREM', list, 0, ARGV[1])
redis.call('HDEL', base .. 'meta', ARGV[1])
redis.call('HDEL', base .. 'job', ARGV[1])
if removed > 0 then
    if redis.call('DECRBY', base .. 'len', removed) < 0 then redis.call('SET', base .. 'len', 0) end
    redis.call('LTRIM', base .. 'wake', removed, -1)
end
if redis.call('LLEN', list) == 0 then redis.call('ZREM', base .. 'users', user) end
return removed
"""

# ARGV: user, amount
CHARGE = """
local base = KEYS[1]
local counter = redis.call('HGET', base .. 'counters', ARGV[1])
if not counter then return 0 end
local new_counter = string.format('%.17g', tonumber(counter) + tonumber(ARGV[2]))
redis.call('HSET', base .. 'counters', ARGV[1], new_counter)
if redis.call('ZSCORE', base .. 'users', ARGV[1]) then
    redis.call('ZADD', base .. 'users', new_counter, ARGV[1])
end
return 1
"""

# Returns {floor, {user, counter, {id, cost, id, cost, ...}}, ...}; numbers as strings.
SNAPSHOT = (
    _COMMON
    + """
local result = {tostring(fmt(floor_counter()))}
local users = redis.call('ZRANGE', base .. 'users', 0, -1, 'WITHSCORES')
for i = 1, #users, 2 do
    local user = users[i]
    local ids = redis.call('LRANGE', base .. 'u:' .. user, 0, -1)
    local hints = {}
    for _, msg in ipairs(ids) do
        local meta = redis.call('HGET', base .. 'meta', msg)
        hints[#hints + 1] = msg
        hints[#hints + 1] = meta and string.match(meta, '^(%S+)') or '0'
    end
    result[#result + 1] = {user, users[i + 1], hints}
end
return result
"""
)
