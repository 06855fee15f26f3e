for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if not v or string.byte(v, 1) ~= P or string.sub(v, 2, TOKEN_END) ~= ARGV[1] then
    TOUCH(ARGV[4])
    return i
  end
end
for _, k in ipairs(KEYS) do
  redis.call('SET', k, ARGV[2], 'PX', ARGV[3])
end
return 0
