for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if not v or string.byte(v, 1) ~= P or string.sub(v, 2, TOKEN_END) ~= ARGV[1] then
    TOUCH(ARGV[4])
    return i
  end
end
for _, k in ipairs(KEYS) do
  local rec = ARGV[2]
  if string.byte(rec, 1) == P then
    local v = redis.call('GET', k)
    local o = string.find(v, ':', LEASE_START, true)
    if o then
      rec = rec .. string.sub(v, o)
    end
  end
  redis.call('SET', k, rec, 'PX', ARGV[3])
end
return 0
