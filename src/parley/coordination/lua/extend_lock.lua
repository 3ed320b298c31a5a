-- Extend a held lock.  A lock that vanished is not taken back: another driver may have
-- held it and let go since, and this one must not touch the workspace again.
-- KEYS: the lock.  ARGV: the lock's token, its new TTL in milliseconds.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
