if FLAG and v then
  local ttl = redis.call('PTTL', k)
  if ttl > 0 then
    redis.call('PEXPIRE', k, ttl)
  end
end
