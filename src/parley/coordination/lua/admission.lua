-- Admission of model calls: one model's two token buckets, its lanes, its tenants'
-- ticket clocks, what its provider said and its 429 penalty, changed atomically.  The
-- arithmetic is parley/coordination/admission_math.py's and admission_feedback.py's,
-- mirrored function by function (each names its Python twin); read admission_math's
-- docstring for what it does and why.
-- The only clock is this server's TIME: one clock for the whole fleet.
-- KEYS: the model's state hash, its tickets zset (tenant -> ticket clock), its weights
-- hash (tenant -> weight), its served hash (tenant -> virtual service), its interactive
-- hash (tenant -> interactive ticket clock); all five in the model's hash slot.
-- ARGV: the operation, then its arguments, then the keys' time to live in seconds:
--   acquire  priority tokens tenant weight configured_rpm configured_tpm
--            fallback_rpm fallback_tpm ttl   (limits: '' when none; fallback: the
--            learned limits the caller saw last, restored into a flushed state)
--            -> {granted (0/1), wait, tokens, reason, learned_rpm, learned_tpm,
--                requests_mark, tokens_mark}
--   settle   reserved used ttl
--   observe  requests_mark tokens_mark requests_remaining tokens_remaining ttl
--            (remaining: '' when not said)
--   penalise retry_after ttl
--   learn    rpm tpm ttl                          ('' leaves that one as it was)
-- Numbers come back as strings: Redis would truncate a Lua number to an integer.

local HEADROOM = 0.98
local BURST_SECONDS = 1.0
local RESERVE_FRACTION = 0.1
local INTERACTIVE_GRACE_SECONDS = 0.25
local TENANT_IDLE_SECONDS = 1.0
local MIN_SLOW = 0.25
local EVIDENCE_HALF_LIFE_SECONDS = 30.0
local RECOVERY_SECONDS = 30.0
local SLACK_SECONDS = 1e-6

local STATE, TICKETS, WEIGHTS, SERVED, INTERACTIVE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local FIELDS = {'r_level', 't_level', 'at', 'rpm', 'tpm', 'learned_rpm', 'learned_tpm',
  'slow', 'slowed_at', 'blocked_until', 'interactive_until', 'r_granted', 't_granted',
  'calls', 'refusals', 'evidence_at'}

local function number(text)
  if text == nil or text == false or text == '' then return nil end
  return tonumber(text)
end

local function text(value)
  if value == nil then return '' end
  return string.format('%.17g', value)
end

local function clock()
  local time = redis.call('TIME')
  return tonumber(time[1]) + tonumber(time[2]) / 1000000
end

-- ModelState, as the hash holds it (absent fields: None).
local function load()
  local values = redis.call('HMGET', STATE, unpack(FIELDS))
  local state = {}
  for i, name in ipairs(FIELDS) do state[name] = number(values[i]) end
  state.slow = state.slow or 1.0
  state.slowed_at = state.slowed_at or 0.0
  state.blocked_until = state.blocked_until or 0.0
  state.interactive_until = state.interactive_until or 0.0
  state.r_granted = state.r_granted or 0.0
  state.t_granted = state.t_granted or 0.0
  state.calls = state.calls or 0.0
  state.refusals = state.refusals or 0.0
  state.evidence_at = state.evidence_at or 0.0
  return state
end

local function save(state, ttl)
  local set, gone = {}, {}
  for _, name in ipairs(FIELDS) do
    if state[name] == nil then
      gone[#gone + 1] = name
    else
      set[#set + 1] = name
      set[#set + 1] = text(state[name])
    end
  end
  redis.call('HSET', STATE, unpack(set))
  if #gone > 0 then redis.call('HDEL', STATE, unpack(gone)) end
  for _, key in ipairs({STATE, TICKETS, WEIGHTS, SERVED, INTERACTIVE}) do
    redis.call('EXPIRE', key, ttl)
  end
end

-- in_force
local function in_force(state, configured_rpm, configured_tpm)
  return configured_rpm or state.learned_rpm, configured_tpm or state.learned_tpm
end

-- slowness
local function slowness(state, now)
  return math.min(1.0, state.slow + math.max(0.0, now - state.slowed_at) / RECOVERY_SECONDS)
end

-- buckets
local function buckets(rpm, tpm, slow)
  local shape = {}
  if rpm ~= nil then
    local r_full = rpm / 60 * HEADROOM
    shape.r_rate = r_full * slow
    shape.r_burst = math.max(1.0, r_full * BURST_SECONDS)
  end
  if tpm ~= nil then
    local t_full = tpm / 60 * HEADROOM
    shape.t_rate = t_full * slow
    shape.t_burst = t_full * BURST_SECONDS
  end
  return shape
end

-- _refilled
local function refilled(level, rate, burst, dt)
  if rate == nil or burst == nil then return nil end
  if level == nil then return burst end
  return math.min(burst, level + rate * dt)
end

-- refill
local function refill(state, now)
  local shape = buckets(state.rpm, state.tpm, slowness(state, now))
  local dt = 0.0
  if state.at ~= nil then dt = math.max(0.0, now - state.at) end
  state.r_level = refilled(state.r_level, shape.r_rate, shape.r_burst, dt)
  state.t_level = refilled(state.t_level, shape.t_rate, shape.t_burst, dt)
  if state.at == nil then state.at = now else state.at = math.max(state.at, now) end
  return shape
end

-- _faded
local function faded(state, now)
  if now > state.evidence_at then
    local fade = 0.5 ^ ((now - state.evidence_at) / EVIDENCE_HALF_LIFE_SECONDS)
    state.calls = state.calls * fade
    state.refusals = state.refusals * fade
    state.evidence_at = now
  end
end

-- _needs
local function needs(shape, tokens, lane)
  local r_need, t_need = 1.0, tokens
  if lane == 'batch' then
    if shape.r_burst ~= nil then r_need = r_need + math.max(1.0, RESERVE_FRACTION * shape.r_burst) end
    if shape.t_burst ~= nil then t_need = t_need + RESERVE_FRACTION * shape.t_burst end
  end
  if shape.r_burst ~= nil then r_need = math.min(r_need, shape.r_burst) else r_need = 0.0 end
  if shape.t_burst ~= nil then t_need = math.min(t_need, shape.t_burst) else t_need = 0.0 end
  return r_need, t_need
end

-- _bucket_waits
local function bucket_waits(state, shape, tokens, lane)
  local r_need, t_need = needs(shape, tokens, lane)
  local r_wait, t_wait = 0.0, 0.0
  if shape.r_rate ~= nil and state.r_level ~= nil then
    r_wait = math.max(0.0, (r_need - state.r_level) / shape.r_rate)
  end
  if shape.t_rate ~= nil and state.t_level ~= nil then
    t_wait = math.max(0.0, (t_need - state.t_level) / shape.t_rate)
  end
  return r_wait, t_wait
end

-- _full
local function full(state, shape)
  return (shape.r_burst == nil or (state.r_level or 0.0) >= shape.r_burst)
    and (shape.t_burst == nil or (state.t_level or 0.0) >= shape.t_burst)
end

-- _take
local function take(state, shape, tokens, now)
  if state.r_level ~= nil then state.r_level = state.r_level - 1 end
  local charged = 0
  if shape.t_burst ~= nil then charged = tokens end
  if state.t_level ~= nil then state.t_level = state.t_level - charged end
  state.r_granted = state.r_granted + 1
  state.t_granted = state.t_granted + charged
  faded(state, now)
  state.calls = state.calls + 1
  return {1, '0', string.format('%d', charged), '', text(state.r_granted), text(state.t_granted)}
end

local function denied(wait, reason)
  return {0, text(wait), '0', reason, '0', '0'}
end

-- prune_tickets
local function prune_tickets(now)
  local idle = redis.call('ZRANGEBYSCORE', TICKETS, '-inf', text(now - TENANT_IDLE_SECONDS))
  if #idle > 0 then
    redis.call('ZREM', TICKETS, unpack(idle))
    redis.call('HDEL', WEIGHTS, unpack(idle))
    redis.call('HDEL', SERVED, unpack(idle))
    redis.call('HDEL', INTERACTIVE, unpack(idle))
  end
end

-- _served_floor
local function served_floor(tenant, now)
  local waiting = redis.call('ZRANGEBYSCORE', TICKETS, '(' .. text(now - TENANT_IDLE_SECONDS), '+inf')
  local floor = nil
  for _, other in ipairs(waiting) do
    if other ~= tenant then
      local served = number(redis.call('HGET', SERVED, other)) or 0.0
      if floor == nil or served < floor then floor = served end
    end
  end
  return floor, waiting
end

-- _turn
local function turn_of(state, shape, tokens, tenant, now)
  local cost = 0.0
  if shape.r_rate ~= nil then cost = 1 / shape.r_rate end
  if shape.t_rate ~= nil then cost = math.max(cost, tokens / shape.t_rate) end
  local floor, waiting = served_floor(tenant, now)
  local served = number(redis.call('HGET', SERVED, tenant)) or floor or 0.0
  local turn = {cost = cost, floor = floor, served = served, full = full(state, shape),
    waiting = waiting}
  turn.in_turn = floor == nil or served <= floor or turn.full
  return turn
end

-- _why
local function why(shape, r_wait, t_wait, aside)
  if aside > math.max(r_wait, t_wait) then return 'interactive' end
  if r_wait > t_wait or (r_wait == t_wait and shape.r_rate ~= nil) then return 'requests' end
  return 'tokens'
end

-- _ticket
local function ticket_of(priority, tenant, weight, now, turn, after, reason)
  redis.call('HSET', SERVED, tenant, text(turn.served))
  redis.call('HSET', WEIGHTS, tenant, text(weight))
  local total = weight
  for _, other in ipairs(turn.waiting) do
    if other ~= tenant then total = total + (number(redis.call('HGET', WEIGHTS, other)) or 1.0) end
  end
  local spacing = turn.cost / (weight / total)
  if not turn.in_turn then after = math.max(after, spacing) end
  local own = number(redis.call('ZSCORE', TICKETS, tenant))
  local ticket
  if priority == 'interactive' then
    local clock = number(redis.call('HGET', INTERACTIVE, tenant))
    ticket = math.max(clock or -math.huge, now + after)
    redis.call('HSET', INTERACTIVE, tenant, text(ticket + spacing))
    redis.call('ZADD', TICKETS, text(math.max(own or -math.huge, ticket)), tenant)
  else
    ticket = math.max(own or -math.huge, now + after)
    redis.call('ZADD', TICKETS, text(ticket + spacing), tenant)
  end
  return denied(ticket - now, reason)
end

-- _interactive
local function interactive(state, shape, tokens, tenant, weight, now, turn)
  local r_wait, t_wait = bucket_waits(state, shape, tokens, 'interactive')
  if r_wait <= SLACK_SECONDS and t_wait <= SLACK_SECONDS then
    if turn.floor ~= nil then
      local own = number(redis.call('ZSCORE', TICKETS, tenant))
      if own == nil or own < now then redis.call('ZADD', TICKETS, text(now), tenant) end
      redis.call('HSET', SERVED, tenant, text(turn.served + turn.cost / weight))
      redis.call('HSET', WEIGHTS, tenant, text(weight))
    end
    return take(state, shape, tokens, now)
  end
  local wait = math.max(r_wait, t_wait)
  state.interactive_until = math.max(state.interactive_until, now + wait + INTERACTIVE_GRACE_SECONDS)
  local reason = 'tokens'
  if r_wait >= t_wait then reason = 'requests' end
  return ticket_of('interactive', tenant, weight, now, turn, wait, reason)
end

-- _batch
local function batch(state, shape, priority, tokens, tenant, weight, now, turn)
  local r_wait, t_wait = bucket_waits(state, shape, tokens, 'batch')
  local aside = math.max(0.0, state.interactive_until - now)
  if r_wait <= SLACK_SECONDS and t_wait <= SLACK_SECONDS and aside <= 0 and turn.in_turn then
    local own = number(redis.call('ZSCORE', TICKETS, tenant))
    if turn.full then
      redis.call('ZADD', TICKETS, text(now), tenant)
      own = now
    end
    if own ~= nil then
      redis.call('HSET', SERVED, tenant, text(turn.served + turn.cost / weight))
      redis.call('HSET', WEIGHTS, tenant, text(weight))
    end
    return take(state, shape, tokens, now)
  end
  return ticket_of(priority, tenant, weight, now, turn, math.max(r_wait, t_wait, aside),
    why(shape, r_wait, t_wait, aside))
end

-- acquire
local function acquire(now)
  local priority, tokens, tenant, weight = ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
  local ttl = ARGV[10]
  local state = load()
  -- A flushed state takes back the learned limits the caller saw last.
  if state.learned_rpm == nil then state.learned_rpm = number(ARGV[8]) end
  if state.learned_tpm == nil then state.learned_tpm = number(ARGV[9]) end
  state.rpm, state.tpm = in_force(state, number(ARGV[6]), number(ARGV[7]))
  local shape = refill(state, now)
  local answer
  if now < state.blocked_until then
    if priority == 'interactive' then
      state.interactive_until = math.max(state.interactive_until,
        state.blocked_until + INTERACTIVE_GRACE_SECONDS)
    end
    answer = denied(state.blocked_until - now, 'penalty')
  elseif state.rpm == nil and state.tpm == nil then
    answer = {1, '0', '0', '', '0', '0'}
  else
    prune_tickets(now)
    local turn = turn_of(state, shape, tokens, tenant, now)
    if priority == 'interactive' and turn.in_turn then
      answer = interactive(state, shape, tokens, tenant, weight, now, turn)
    else
      answer = batch(state, shape, priority, tokens, tenant, weight, now, turn)
    end
  end
  save(state, ttl)
  local marks = {answer[5], answer[6]}
  answer[5] = text(state.learned_rpm)
  answer[6] = text(state.learned_tpm)
  answer[7] = marks[1]
  answer[8] = marks[2]
  return answer
end

-- settle
local function settle(now)
  local reserved, used, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
  local state = load()
  if reserved == 0 or state.tpm == nil or state.at == nil then return 0 end
  local shape = refill(state, now)
  if state.t_level ~= nil and shape.t_burst ~= nil then
    state.t_level = math.min(shape.t_burst, state.t_level + reserved - used)
  end
  save(state, ttl)
  return 1
end

-- observe
local function observe(now)
  local requests_mark, tokens_mark = tonumber(ARGV[2]), tonumber(ARGV[3])
  local requests_remaining, tokens_remaining = number(ARGV[4]), number(ARGV[5])
  local ttl = ARGV[6]
  local state = load()
  if state.at == nil then return 0 end
  refill(state, now)
  if requests_remaining ~= nil and state.r_level ~= nil then
    local ahead = math.max(0.0, state.r_granted - requests_mark)
    state.r_level = math.min(state.r_level, requests_remaining - ahead)
  end
  if tokens_remaining ~= nil and state.t_level ~= nil then
    local ahead = math.max(0.0, state.t_granted - tokens_mark)
    state.t_level = math.min(state.t_level, tokens_remaining - ahead)
  end
  save(state, ttl)
  return 1
end

-- penalise
local function penalise(now)
  local retry_after, ttl = tonumber(ARGV[2]), ARGV[3]
  local state = load()
  refill(state, now)
  faded(state, now)
  state.refusals = state.refusals + 1
  local cut = (state.refusals - 1) / math.max(1.0, state.calls)
  state.slow = math.max(MIN_SLOW, math.min(slowness(state, now), 1 - cut))
  state.slowed_at = now
  state.blocked_until = math.max(state.blocked_until, now + retry_after)
  state.r_level = math.min(state.r_level or 0.0, 0.0)
  state.t_level = math.min(state.t_level or 0.0, 0.0)
  state.at = math.max(state.at or now, state.blocked_until)
  save(state, ttl)
  return 1
end

-- learn
local function learn()
  local state = load()
  state.learned_rpm = number(ARGV[2]) or state.learned_rpm
  state.learned_tpm = number(ARGV[3]) or state.learned_tpm
  save(state, ARGV[4])
  return 1
end

local operation = ARGV[1]
if operation == 'acquire' then return acquire(clock()) end
if operation == 'settle' then return settle(clock()) end
if operation == 'observe' then return observe(clock()) end
if operation == 'penalise' then return penalise(clock()) end
if operation == 'learn' then return learn() end
return redis.error_reply('admission.lua: unknown operation ' .. tostring(operation))
