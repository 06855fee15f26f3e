local v = redis.call('GET', KEYS[1])
if not v then
  return {}
end
local pttl = redis.call('PTTL', KEYS[1])
if (string.byte(v, 1) ~= P) == (ARGV[1] == 'd') then
  redis.call('DEL', KEYS[1])
  return {1, v, pttl}
end
return {0, v, pttl}
