for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if not v or string.byte(v, 1) ~= P or string.sub(v, 2, TOKEN_END) ~= ARGV[1] then
    TOUCH(ARGV[2])
    return i
  end
end
redis.call('DEL', unpack(KEYS))
return 0
