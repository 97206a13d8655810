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
  // TATs and the permits the ones before it left: the answers of one call
  // for N requests are those of N calls at the same instant. The keys are
  // read and written once per call.
  static const Script script(with_clock(R"lua(
local interval = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local tpm_on = ARGV[3] == '1'
local max_parallel = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local most = tonumber(ARGV[6])
local holder = ARGV[7]
local mine = tonumber(ARGV[8])
local first_request = 10 + tonumber(ARGV[9])
local tpm_owed = nil
local tpm_moved = false
for i = 10, first_request - 1 do
  local delta = tonumber(ARGV[i])
  if tpm_owed == nil then tpm_owed = owed(KEYS[2]) end
  tpm_owed = tpm_owed + delta
  if tpm_owed < 0 then tpm_owed = 0 end
  if tpm_owed > most then tpm_owed = most end
  tpm_moved = true
end
local out = {}
if first_request <= #ARGV then
  local rpm_owed = 0
  if interval > 0 then rpm_owed = owed(KEYS[1]) end
  if tpm_owed == nil and tpm_on then tpm_owed = owed(KEYS[2]) end
  local held = mine
  if max_parallel > 0 then
    -- The other holders' counts, those whose holder renewed them in time;
    -- an entry past its expiry is an instance that died, and goes.
    local entries = redis.call('HGETALL', KEYS[3])
    local expired = {}
    for i = 1, #entries, 2 do
      if entries[i] ~= holder then
        local count, expiry = string.match(entries[i + 1], '^(%d+) (%d+)$')
        if count and tonumber(expiry) > now_ms then
          held = held + tonumber(count)
        else
          expired[#expired + 1] = entries[i]
        end
      end
    end
    if #expired > 0 then redis.call('HDEL', KEYS[3], unpack(expired)) end
  end
  local rpm_moved = false
  for i = first_request, #ARGV do
    local cost = tonumber(ARGV[i])
    local refused = 0
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
        held = held + 1
        mine = mine + 1
      end
    end
  end
  if rpm_moved then store(KEYS[1], rpm_owed) end
  out[#out + 1] = held
end
if tpm_moved then store(KEYS[2], tpm_owed) end
if max_parallel > 0 then
  if mine > 0 then
    redis.call('HSET', KEYS[3], holder, string.format('%d %d', mine, now_ms + ttl))
    redis.call('PEXPIRE', KEYS[3], ttl)
  else
    redis.call('HDEL', KEYS[3], holder)
  end
end
return out
)lua"));
  return script;
}

const Script& renew_script() {
  static const Script script(with_clock(R"lua(
local ttl = tonumber(ARGV[1])
local holder = ARGV[2]
for _, key in ipairs(KEYS) do
  local entry = redis.call('HGET', key, holder)
  if entry then
    local count = string.match(entry, '^(%d+) ')
    redis.call('HSET', key, holder, count .. ' ' .. string.format('%d', now_ms + ttl))
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
