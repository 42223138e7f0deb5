"""The Redis broker's counter scripts (:mod:`.counters`): each runs atomically, on Redis' own clock
(``TIME``), so replicas with skewed clocks count the same windows. A window counter is a hash of
per-second buckets (field: the second, value: the amount); a plain counter is a string with an expiry."""

from __future__ import annotations

# Sums a window counter's buckets younger than the window, deleting the older ones.
_WINDOW = """
local t = redis.call('TIME')
local now = tonumber(t[1])
local function window_used(key, window)
    local flat = redis.call('HGETALL', key)
    local used, buckets, stale = 0, {}, {}
    for i = 1, #flat, 2 do
        local second, amount = tonumber(flat[i]), tonumber(flat[i + 1])
        if second <= now - window then
            stale[#stale + 1] = flat[i]
        else
            used = used + amount
            buckets[#buckets + 1] = {second, amount}
        end
    end
    if #stale > 0 then
        redis.call('HDEL', key, unpack(stale))
    end
    return used, buckets
end
"""

# KEYS: the counters; ARGV: for each, limit, need, window (s, 0: plain), ttl (s), seeded (1: a missing
# plain counter is refused with -2). Returns {0, 0, 0} when every counter had room (each then got its
# need), else {index (1-based), used, seconds to wait or -1, or -2 for a missing seeded counter}.
CHECK = (
    _WINDOW
    + """
for i, key in ipairs(KEYS) do
    local base = (i - 1) * 5
    local limit, need, window = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
    local want = math.max(need, 1)
    if window > 0 then
        local used, buckets = window_used(key, window)
        if used + want > limit then
            if want > limit then
                return {i, used, -1}
            end
            table.sort(buckets, function(a, b) return a[1] < b[1] end)
            local freed, excess = 0, used + want - limit
            for _, bucket in ipairs(buckets) do
                freed = freed + bucket[2]
                if freed >= excess then
                    return {i, used, math.max(1, bucket[1] + window - now)}
                end
            end
            return {i, used, window}
        end
    else
        local value = redis.call('GET', key)
        if not value and ARGV[base + 5] == '1' then
            return {i, 0, -2}
        end
        local used = tonumber(value or '0')
        if used + want > limit then
            return {i, used, -1}
        end
    end
end
for i, key in ipairs(KEYS) do
    local base = (i - 1) * 5
    local need, window, ttl = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
    if need > 0 then
        if window > 0 then
            redis.call('HINCRBY', key, now, need)
            redis.call('EXPIRE', key, window + 1)
        else
            redis.call('INCRBY', key, need)
            redis.call('EXPIRE', key, ttl)
        end
    end
end
return {0, 0, 0}
"""
)

# KEYS[1]: the "once" marker (ARGV[1] = 1 to use it, ARGV[2] its ttl in s), then the counters; ARGV from
# 3: for each counter, amount, window, ttl, existing_only (1: a missing plain counter is left missing).
# Returns 0 (nothing added) if the marker was already set. A window's buckets that left it go here too:
# a counter only ever added to (tokens per minute of a subject without that limit) would otherwise gain a
# bucket a second for as long as it is charged.
ADD = (
    _WINDOW
    + """
if ARGV[1] == '1' then
    if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then
        return 0
    end
end
for i = 2, #KEYS do
    local base = 3 + (i - 2) * 4
    local amount, window, ttl = tonumber(ARGV[base]), tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
    if amount ~= 0 then
        if window > 0 then
            window_used(KEYS[i], window)
            redis.call('HINCRBY', KEYS[i], now, amount)
            redis.call('EXPIRE', KEYS[i], window + 1)
        elseif ARGV[base + 3] == '1' and redis.call('EXISTS', KEYS[i]) == 0 then
            -- rebuilt from the database when next checked
        else
            redis.call('INCRBY', KEYS[i], amount)
            redis.call('EXPIRE', KEYS[i], ttl)
        end
    end
end
return 1
"""
)

# KEYS: the counters; ARGV: each one's window (0: plain). Returns what each holds.
READ = (
    _WINDOW
    + """
local values = {}
for i, key in ipairs(KEYS) do
    local window = tonumber(ARGV[i])
    if window > 0 then
        values[i] = window_used(key, window)
    else
        values[i] = tonumber(redis.call('GET', key) or '0')
    end
end
return values
"""
)
