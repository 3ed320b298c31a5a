-- Append events to a turn's stream in seq order (skipping any already there), publish
-- them as one message, and return the length of the turn's steer list (a steer pushed
-- since the driver last read the list shows as a longer one).  A driver publishes with
-- its fence: once a newer driver adopted the turn, the older one's events are dropped.
-- An ``end`` is also noted on the turn's ends stream, for waiters.  A stream lives the
-- replay period (an hour by default) past its turn's end, the ends stream a minute, and
-- before that IDLE_BUFFER_SECONDS past its driver's latest event (past its first event
-- if no driver ever published: announcements leave the expiry alone once set), so no
-- buffer outlives its use: not one of a turn that never ends, nor one whose submission
-- rolled back after announcing it, while a running turn keeps its whole buffer.
-- The steer list lives as long as the buffer once the turn ended.
-- On a Redis Cluster (ARGV[6] is 1) the channels are sharded ones (SPUBLISH, heard on
-- the node that holds the turn), and an end is also announced on the turn's ended
-- channel, which ends watchers subscribe to there.
-- KEYS: stream, channel, steer list, owner, ends, ended channel.  ARGV: seq of the
-- batch's end (0: none), buffer ttl, fence (0: not a driver), idle ttl, ends ttl,
-- sharded (1/0), then seq, json, seq, json...
local owner = tonumber(redis.call('GET', KEYS[4]) or '0')
if tonumber(ARGV[3]) > 0 and tonumber(ARGV[3]) < owner then
  return redis.call('LLEN', KEYS[3])
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local top = 0
if #last > 0 then top = tonumber(string.match(last[1][1], '^(%d+)')) end
local ended = tonumber(ARGV[1])
local fresh = {}
local sharded = ARGV[6] == '1'
for i = 7, #ARGV, 2 do
  local seq = tonumber(ARGV[i])
  if seq > top then
    redis.call('XADD', KEYS[1], seq .. '-0', 'e', ARGV[i + 1])
    top = seq
    fresh[#fresh + 1] = ARGV[i + 1]
    if seq == ended then
      redis.call('XADD', KEYS[5], seq .. '-0', 'e', '')
      redis.call('EXPIRE', KEYS[5], tonumber(ARGV[5]))
      if sharded then redis.call('SPUBLISH', KEYS[6], seq) end
    end
  end
end
if #fresh > 0 then
  local message = '[' .. table.concat(fresh, ',') .. ']'
  if sharded then
    redis.call('SPUBLISH', KEYS[2], message)
  else
    redis.call('PUBLISH', KEYS[2], message)
  end
end
if ended > 0 then
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
  redis.call('EXPIRE', KEYS[3], tonumber(ARGV[2]))
elseif #fresh > 0 and tonumber(ARGV[3]) > 0 then
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
elseif #fresh > 0 then
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]), 'NX')
end
return redis.call('LLEN', KEYS[3])
