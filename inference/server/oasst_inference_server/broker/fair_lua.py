"""The Redis broker's fair queues: :mod:`.fair`'s rules as Lua scripts, so each step is atomic.

Keys of one queue, all under the queue's base name ``KEYS[1]`` (``<prefix>queue:<name>:``):

* ``users``     sorted set: backlogged user -> counter (the next hint comes from its first member);
* ``counters``  hash: user -> counter, idle users included (a returning user's counter is lifted);
* ``u:<user>``  list: that user's waiting message ids, oldest first;
* ``meta``      hash: message id -> ``"<cost> <user>"``;
* ``job``       hash: message id -> the job note pushed with its hint (only where one was given);
* ``served``    string: the counter of the user served last (the floor when nobody waits);
* ``len``       string: how many hints wait;
* ``wake``      list: one token per waiting hint; a blocked popper BLPOPs it, then runs ``POP``.

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
"""

# ARGV: message id, user, cost, credit, job note ("" for none)
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
redis.call('RPUSH', base .. 'wake', '1')
return 1
"""
)

# ARGV: "1" to consume a wake token (the caller did not BLPOP one).
# Returns {message id, job note or ""}, or false.
POP = (
    _COMMON
    + """
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
        if ARGV[1] == '1' then redis.call('LPOP', base .. 'wake') end
        local job = redis.call('HGET', base .. 'job', msg)
        if job then redis.call('HDEL', base .. 'job', msg) end
        return {msg, job or ''}
    end
    redis.call('ZREM', base .. 'users', user)
end
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
