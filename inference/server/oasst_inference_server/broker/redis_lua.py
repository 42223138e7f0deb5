"""The Lua scripts of the Redis broker (:mod:`.redis`) other than the fair queue's (:mod:`.fair_lua`) and the
usage counters' (:mod:`.counters_lua`): the lock, the slots, and the event streams' batch append and
delete. Each runs atomically in Redis."""

from __future__ import annotations

from oasst_inference_server.broker.redis_replies import DATA_FIELD

ACQUIRE_LOCK = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
end
if not holder then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 1
end
return 0
"""

# Deletes a stream and says how many ms Redis' clock trails its last id (negative: already past it).
DELETE_STREAM = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
redis.call('DEL', KEYS[1])
if #last == 0 then
    return -1
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
return tonumber(string.match(last[1][1], '^(%d+)')) - now_ms
"""

# ARGV[1] is the approximate MAXLEN, ARGV[2] an expiry in ms; then, for each KEYS[i] in turn, a count n
# and n events, XADDed to it in order. Each stream's expiry is pushed to ARGV[2] ms from now: a stream
# whose terminal event never comes still expires. Grouped by stream, a key crosses the wire once per
# batch, not once per token.
APPEND_EVENTS = f"""
local at = 3
for _, key in ipairs(KEYS) do
    local last = at + tonumber(ARGV[at])
    for j = at + 1, last do
        redis.call('XADD', key, 'MAXLEN', '~', ARGV[1], '*', '{DATA_FIELD}', ARGV[j])
    end
    redis.call('PEXPIRE', key, ARGV[2])
    at = last + 1
end
return #KEYS
"""

# KEYS: the slots' sorted sets; ARGV: holder, ttl in ms, then each key's limit. All or none: 0 when the
# holder has them all, else the (1-based) index of a full one. Expired holders go first; Redis' own
# clock stamps the expiries, so replicas with skewed clocks agree.
ACQUIRE_SLOTS = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
for i, key in ipairs(KEYS) do
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
    if not redis.call('ZSCORE', key, ARGV[1]) and redis.call('ZCARD', key) >= tonumber(ARGV[2 + i]) then
        return i
    end
end
for _, key in ipairs(KEYS) do
    redis.call('ZADD', key, now_ms + tonumber(ARGV[2]), ARGV[1])
    redis.call('PEXPIRE', key, ARGV[2])
end
return 0
"""

RELEASE_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""
