-- Let go of a session's lock if it is still ours, and return the session's work mark.
-- KEYS: the lock, the session's kick-pending flag, its work mark.  ARGV: the lock's token.
-- Letting go also lowers the flag, so from here on a submission kicks again; until here
-- submissions needed none, since the driver reads the work mark (returned) before it stops.
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('DEL', KEYS[2])
return redis.call('GET', KEYS[3])
