local v = redis.call('GET', KEYS[1])
if not v then
  return {}
end
local m = redis.pcall('MEMORY', 'USAGE', KEYS[1], 'SAMPLES', '0')
if type(m) ~= 'number' then
  m = -1
end
return {string.sub(v, 1, 64), redis.call('PTTL', KEYS[1]), m}
