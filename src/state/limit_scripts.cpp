#include "sluice/state/limit_scripts.hpp"

namespace sluice::state {
namespace {

// Shared by the scripts: the time, and a TAT read as "ns ahead of now" and
// written back as "now + ns". fmod is exact, so the split into seconds and
// nanoseconds loses nothing.
constexpr const char* kClock = R"lua(
local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now_n = tonumber(t[2]) * 1000
local now_ms = now_s * 1000 + math.floor(now_n / 1000000)
local function owed(key)
  local v = redis.call('GET', key)
  if not v then return 0 end
  local d = (tonumber(string.sub(v, 1, -10)) - now_s) * 1000000000 +
            (tonumber(string.sub(v, -9)) - now_n)
  if d < 0 then return 0 end
  return d
end
local function store(key, ahead)
  local n = now_n + ahead
  local r = math.fmod(n, 1000000000)
  redis.call('SET', key, string.format('%d%09d', now_s + (n - r) / 1000000000, r),
             'PX', math.floor(ahead / 1000000) + 1000)
end
)lua";

std::string with_clock(std::string_view body, std::string_view tail = {}) {
  std::string source(kClock);
  source.append(body).append(tail);
  return source;
}

}  // namespace

const Script& budget_script() {
  // Settlements move the tpm TAT in turn, each from where the one before
  // left it; then the requests are judged in their order, each against the
  // TATs and the lease count the ones before it left: the answers of one
  // call for N requests are those of N calls at the same instant. The keys
  // are read and written once per call.
  static const Script script(with_clock(R"lua(
local interval = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local tpm_on = ARGV[3] == '1'
local max_parallel = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local most = tonumber(ARGV[6])
local first_request = 8 + 2 * tonumber(ARGV[7])
local tpm_owed = nil
local tpm_moved = false
local given_back = {}
for i = 8, first_request - 1, 2 do
  local delta = tonumber(ARGV[i])
  if delta ~= 0 then
    if tpm_owed == nil then tpm_owed = owed(KEYS[2]) end
    tpm_owed = tpm_owed + delta
    if tpm_owed < 0 then tpm_owed = 0 end
    if tpm_owed > most then tpm_owed = most end
    tpm_moved = true
  end
  if ARGV[i + 1] ~= '' then given_back[#given_back + 1] = ARGV[i + 1] end
end
if #given_back > 0 then redis.call('ZREM', KEYS[3], unpack(given_back)) end
local out = {}
if first_request <= #ARGV then
  local rpm_owed = 0
  if interval > 0 then rpm_owed = owed(KEYS[1]) end
  if tpm_owed == nil and tpm_on then tpm_owed = owed(KEYS[2]) end
  local held = 0
  if max_parallel > 0 then held = redis.call('ZCARD', KEYS[3]) end
  local cleared = false
  local rpm_moved = false
  local leases = {}
  for i = first_request, #ARGV, 2 do
    local cost = tonumber(ARGV[i])
    local refused = 0
    if max_parallel > 0 and held >= max_parallel and not cleared then
      -- Expired leases (of an instance that died) matter only when they
      -- would refuse: they are cleared then, not on every request.
      redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
      held = redis.call('ZCARD', KEYS[3]) + #leases / 2
      cleared = true
    end
    if max_parallel > 0 and held >= max_parallel then
      refused = 1
    elseif interval > 0 and rpm_owed + interval > window then
      refused = 2
    elseif tpm_on and cost > 0 and tpm_owed >= 60000000000 then
      refused = 3
    end
    out[#out + 1] = refused
    out[#out + 1] = rpm_owed
    out[#out + 1] = tpm_on and tpm_owed or 0
    if refused == 0 then
      if interval > 0 then
        rpm_owed = rpm_owed + interval
        rpm_moved = true
      end
      if tpm_on and cost > 0 then
        tpm_owed = tpm_owed + cost
        tpm_moved = true
      end
      if max_parallel > 0 then
        leases[#leases + 1] = now_ms + ttl
        leases[#leases + 1] = ARGV[i + 1]
        held = held + 1
      end
    end
  end
  if rpm_moved then store(KEYS[1], rpm_owed) end
  if #leases > 0 then
    redis.call('ZADD', KEYS[3], unpack(leases))
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
end
if tpm_moved then store(KEYS[2], tpm_owed) end
return out
)lua"));
  return script;
}

const Script& renew_script() {
  static const Script script(with_clock(R"lua(
local ttl = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  if redis.call('ZSCORE', key, ARGV[i + 1]) then
    redis.call('ZADD', key, now_ms + ttl, ARGV[i + 1])
    redis.call('PEXPIRE', key, ttl)
  end
end
return 0
)lua"));
  return script;
}

const Script& cooldown_script() {
  static const Script script(with_clock(R"lua(
if ARGV[1] == 'ok' then
  redis.call('DEL', KEYS[1])
  return 0
end
local ends = now_ms + tonumber(ARGV[2])
local current = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
if current > ends then ends = current end
redis.call('HSET', KEYS[1], 'until', ends)
redis.call('HDEL', KEYS[1], 'probe', 'probe_at')
redis.call('PEXPIRE', KEYS[1], ends - now_ms + 600000)
return 0
)lua"));
  return script;
}

const Script& cooldown_poll_script() {
  static const Script script(with_clock(R"lua(
local out = {}
local timeout = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  local fields = redis.call('HMGET', key, 'until', 'probe', 'probe_at')
  if not fields[1] then
    table.insert(out, 0)
    table.insert(out, 0)
  elseif now_ms < tonumber(fields[1]) then
    table.insert(out, 1)
    table.insert(out, tonumber(fields[1]) - now_ms)
  elseif fields[2] == ARGV[1] then
    table.insert(out, 2)
    table.insert(out, 0)
  elseif fields[2] and now_ms - tonumber(fields[3]) < timeout then
    table.insert(out, 3)
    table.insert(out, 0)
  else
    redis.call('HSET', key, 'probe', ARGV[1], 'probe_at', now_ms)
    table.insert(out, 2)
    table.insert(out, 0)
  end
end
return out
)lua"));
  return script;
}

}  // namespace sluice::state
