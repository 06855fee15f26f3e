local token, busy, taken = ARGV[1], false, {1}
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if v then
    if string.byte(v, 1) ~= P then
      return {2, i, v}
    end
    if string.sub(v, 2, TOKEN_END) ~= token then
      local pttl = redis.call('PTTL', k)
      if pttl > tonumber(string.match(v, '^%d+', LEASE_START)) then
        if not busy or not string.find(busy, ':', LEASE_START, true) then
          busy = v
        end
      else
        taken[#taken + 1] = i
        taken[#taken + 1] = v
        taken[#taken + 1] = pttl
      end
    end
  end
end
if busy then
  return {3, busy}
end
local rec = 'p' .. token .. ARGV[2] .. ARGV[4]
for _, k in ipairs(KEYS) do
  redis.call('SET', k, rec, 'PX', ARGV[3])
end
return taken
