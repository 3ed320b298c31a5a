-- Make a driver's fence the turn's publisher (never lowering it), give the buffer and
-- the steer list a running turn's life again unless a newer driver adopted it (a resumed
-- turn's were set to expire after its earlier end), and return the newest seq in the
-- buffer, so the driver numbers its events above everything published.
-- KEYS: owner, stream, steer list.  ARGV: fence, ttl of a running turn's keys.
local owner = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > owner then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
end
if tonumber(ARGV[1]) >= owner then
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  redis.call('EXPIRE', KEYS[3], ARGV[2])
end
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #last == 0 then return 0 end
return tonumber(string.match(last[1][1], '^(%d+)'))
