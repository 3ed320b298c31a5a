-- Let go of a session's lock if it is still ours, and return the session's work mark.
-- KEYS: the lock, the session's kick-pending flag, its work mark.  ARGV: the lock's token,
-- and, for a driver that hands the session over with a kick, the flag's life in seconds.
-- Letting go also lowers the flag, so from here on a submission kicks again; until here
-- submissions needed none, since the driver reads the work mark (returned) before it stops.
-- Handing over raises it afresh instead, in the same step: the sweeper, which kicks a
-- session with no lock and no fresh flag, must not find the gap before the kick is sent.
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if ARGV[2] then
    redis.call('SET', KEYS[2], 1, 'EX', ARGV[2])
else
    redis.call('DEL', KEYS[2])
end
return redis.call('GET', KEYS[3])
