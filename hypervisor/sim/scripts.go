package sim

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Every script touches the keys of one hash tag (one host, or one domain)
// and answers a table whose first element is a status code; the Go side
// turns codes into errors. A refusal because of a migration mark (INCOMING,
// MIGRATING) carries the mark's token, so that the caller can abort a dead
// migration holding the domain and try again (see reap). A script that
// acts on a domain for a driver call (KEYS topo, domains, dom, power)
// refuses with OFF while the host is powered off, since a dead host's
// hypervisor does not answer; the steps that end a migration (promote,
// remove the source, abort) do not, as they model what the hosts do once
// the migration has failed or passed its switchover (see PowerOff).

// clockLua starts the scripts that need the time: now() is Redis's clock
// in ms, the one clock every worker shares.
const clockLua = `
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`

// settleLua starts the scripts that read a domain's run state. A guest
// shutdown is stored as the time it completes (shutdown_due, in ms of
// Redis's clock) rather than run by a timer, which a worker could die
// before firing; settle(k) applies a shutdown that is due to the domain in
// key k, so that no script acts on a state that is over.
const settleLua = clockLua + `
local function settle(k)
  local due = redis.call('HGET', k, 'shutdown_due')
  if due and now() >= tonumber(due) then
    redis.call('HSET', k, 'state', 'shutoff')
    redis.call('HDEL', k, 'shutdown_due')
  end
end
`

// Host keys: KEYS[1] topo. ARGV[1] topology JSON.
var addHostScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false then
  redis.call('SET', KEYS[1], ARGV[1])
  return {'OK'}
end
if cur == ARGV[1] then return {'OK'} end
return {'EXISTS'}
`)

// KEYS topo, domains, and the host's other keys (latency, faults, ...).
var removeHostScript = redis.NewScript(`
local n = redis.call('SCARD', KEYS[2])
if n > 0 then return {'BUSY', tostring(n)} end
redis.call('DEL', KEYS[1], unpack(KEYS, 3))
return {'OK'}
`)

// KEYS topo, domains, dom, power. ARGV uuid, name, xml.
var defineScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'OFF'} end
local g = redis.call('HMGET', KEYS[3], 'incoming', 'migration')
if g[1] == '1' then return {'INCOMING', g[2] or ''} end
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('HSET', KEYS[3], 'uuid', ARGV[1], 'state', 'shutoff')
  redis.call('SADD', KEYS[2], ARGV[1])
end
redis.call('HSET', KEYS[3], 'name', ARGV[2], 'xml', ARGV[3])
return {'OK'}
`)

// KEYS topo, domains, dom, power. ARGV xml the placement was checked
// against. A running domain whose shutdown is pending stays as it is: the
// guest is powering off, as a real one would after Start found it running.
var startScript = redis.NewScript(settleLua + `
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'OFF'} end
settle(KEYS[3])
local f = redis.call('HMGET', KEYS[3], 'state', 'incoming', 'xml')
if not f[1] then return {'NOTFOUND'} end
if f[2] == '1' then return {'INCOMING'} end
if f[1] == 'running' then return {'OK'} end
if f[3] ~= ARGV[1] then return {'CHANGED'} end
redis.call('HSET', KEYS[3], 'state', 'running')
return {'OK'}
`)

// KEYS topo, domains, dom, power.
var stopScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'OFF'} end
local f = redis.call('HMGET', KEYS[3], 'state', 'incoming', 'migration')
if not f[1] then return {'NOTFOUND'} end
if f[2] == '1' then return {'INCOMING', f[3] or ''} end
if f[3] and f[3] ~= '' then return {'MIGRATING', f[3]} end
redis.call('HSET', KEYS[3], 'state', 'shutoff')
redis.call('HDEL', KEYS[3], 'shutdown_due')
return {'OK'}
`)

// KEYS topo, domains, dom, power. ARGV latency in ms, ignored ("1": the
// guest ignores the request). A latency of 0 shuts the domain off now;
// otherwise it is due then, or earlier if an earlier request is pending.
var shutdownScript = redis.NewScript(settleLua + `
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'OFF'} end
settle(KEYS[3])
local f = redis.call('HMGET', KEYS[3], 'state', 'incoming', 'migration', 'shutdown_due')
if not f[1] then return {'NOTFOUND'} end
if f[2] == '1' then return {'INCOMING', f[3] or ''} end
if f[3] and f[3] ~= '' then return {'MIGRATING', f[3]} end
if f[1] == 'shutoff' or ARGV[2] == '1' then return {'OK'} end
local ms = tonumber(ARGV[1])
if ms <= 0 then
  redis.call('HSET', KEYS[3], 'state', 'shutoff')
  redis.call('HDEL', KEYS[3], 'shutdown_due')
  return {'OK'}
end
local due = now() + ms
if f[4] and tonumber(f[4]) <= due then return {'OK'} end
redis.call('HSET', KEYS[3], 'shutdown_due', string.format('%d', due))
return {'OK'}
`)

// KEYS topo, domains, dom, power. ARGV uuid.
var undefineScript = redis.NewScript(settleLua + `
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'OFF'} end
settle(KEYS[3])
local f = redis.call('HMGET', KEYS[3], 'state', 'incoming', 'migration')
if not f[1] then
  redis.call('SREM', KEYS[2], ARGV[1])
  return {'OK'}
end
if f[2] == '1' then return {'INCOMING', f[3] or ''} end
if f[1] ~= 'shutoff' then return {'ACTIVE', f[1]} end
redis.call('DEL', KEYS[3])
redis.call('SREM', KEYS[2], ARGV[1])
return {'OK'}
`)

// KEYS faults. ARGV op. Counts one call down; answers FAIL, or the
// host's rate when one is set, or NONE.
var faultScript = redis.NewScript(`
local tf = ARGV[1] .. ':times'
local n = tonumber(redis.call('HGET', KEYS[1], tf) or '0')
if n > 0 then
  if n == 1 then redis.call('HDEL', KEYS[1], tf) else redis.call('HINCRBY', KEYS[1], tf, -1) end
  return {'FAIL'}
end
local r = redis.call('HGET', KEYS[1], ARGV[1] .. ':rate')
if r then return {'RATE', r} end
return {'NONE'}
`)

// KEYS topo, faults. ARGV op, times, rate. Sets or (times "", rate "")
// clears one operation's fault on a known host.
var setFaultScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
local tf, rf = ARGV[1] .. ':times', ARGV[1] .. ':rate'
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[2], tf, rf)
  return {'OK'}
end
if ARGV[2] == '0' then redis.call('HDEL', KEYS[2], tf) else redis.call('HSET', KEYS[2], tf, ARGV[2]) end
redis.call('HSET', KEYS[2], rf, ARGV[3])
return {'OK'}
`)

// KEYS topo, a hash of the host's settings (latency). ARGV field,
// value ("" clears).
var setHostFieldScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
if ARGV[2] == '' then redis.call('HDEL', KEYS[2], ARGV[1]) else redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
return {'OK'}
`)

// Domain keys: KEYS home, migration. ARGV host. Makes host the domain's
// home unless it lives elsewhere (OTHER) or is migrating between two other
// hosts (MIGRATING).
var claimHomeScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[2], 'phase', 'src', 'dst')
if m[1] and m[1] ~= 'completed' and m[2] ~= ARGV[1] then
  return {'MIGRATING', m[2], m[3]}
end
local h = redis.call('GET', KEYS[1])
if h == false or h == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1])
  return {'OK'}
end
return {'OTHER', h}
`)

// KEYS home. ARGV old, new. Compare-and-set.
var moveHomeScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return {'OK'}
end
return {'CHANGED'}
`)

// KEYS home, migration. ARGV host. After an undefine on host: the domain
// has no home, and a completed migration to host is no longer undoable.
var releaseHomeScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
local m = redis.call('HMGET', KEYS[2], 'phase', 'dst')
if m[1] == 'completed' and m[2] == ARGV[1] then redis.call('DEL', KEYS[2]) end
return {'OK'}
`)

// KEYS topo, domains, power, then the dom key of each UUID in ARGV, which
// are the domains the caller read from the host's set. Powers the host
// off: every domain on it is shut off at once, a pending shutdown with it,
// and the answer lists the domains that carry a migration mark, as uuid,
// incoming ("1" or ""), token triples, for the caller to end their
// migrations. The host is off before the set is compared, so that no
// domain can join it any more (every script that adds one refuses with
// OFF); a set that has grown since the caller read it answers CHANGED,
// and the caller reads it again.
var powerOffScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
redis.call('SET', KEYS[3], 'off')
local given = {}
for _, u in ipairs(ARGV) do given[u] = true end
for _, u in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if not given[u] then return {'CHANGED'} end
end
local out = {'OK'}
for i, u in ipairs(ARGV) do
  local k = KEYS[3 + i]
  if redis.call('EXISTS', k) == 1 then
    redis.call('HSET', k, 'state', 'shutoff')
    redis.call('HDEL', k, 'shutdown_due')
    local f = redis.call('HMGET', k, 'incoming', 'migration')
    if f[1] == '1' or (f[2] and f[2] ~= '') then
      table.insert(out, u)
      table.insert(out, f[1] or '')
      table.insert(out, f[2] or '')
    end
  end
end
return out
`)

// KEYS topo, power. Powers the host on; its domains stay as they are,
// shut off.
var powerOnScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
redis.call('DEL', KEYS[2])
return {'OK'}
`)

// KEYS migration. ARGV host. A migration still copying to or from a host
// that powered off is dead: it enters phase aborting, as staleScript puts
// a stale one, and the abort of dead migrations (see reap) undoes it.
// Answers the record's phase ("" without one).
var hostDownScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'phase', 'src', 'dst')
if not m[1] then return {''} end
if m[1] == 'copying' and (m[2] == ARGV[1] or m[3] == ARGV[1]) then
  redis.call('HSET', KEYS[1], 'phase', 'aborting')
  return {'aborting'}
end
return {m[1]}
`)

// Migration steps, in the order Migrate runs them.

// KEYS home, migration. ARGV src, dst, dest_xml, src_xml, name, token,
// started. Step 1: the record (phase copying, touched now), home = src.
var beginScript = redis.NewScript(clockLua + `
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'src', ARGV[1], 'dst', ARGV[2], 'dest_xml', ARGV[3], 'src_xml', ARGV[4],
  'name', ARGV[5], 'token', ARGV[6], 'phase', 'copying', 'started', ARGV[7],
  'touched', string.format('%d', now()))
redis.call('SET', KEYS[1], ARGV[1])
return {'OK'}
`)

// KEYS topo, domains, dom, power (source). ARGV token. Step 2: the source
// domain must run, and not be shutting down; it is marked as migrating,
// which Stop and Shutdown refuse. So a marked domain never has a shutdown
// pending.
var markSourceScript = redis.NewScript(settleLua + `
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'OFF'} end
settle(KEYS[3])
local f = redis.call('HMGET', KEYS[3], 'state', 'incoming', 'shutdown_due')
if not f[1] then return {'NOTFOUND'} end
if f[2] == '1' then return {'INCOMING'} end
if f[1] ~= 'running' then return {'NOTRUNNING', f[1]} end
if f[3] then return {'SHUTTINGDOWN'} end
redis.call('HSET', KEYS[3], 'migration', ARGV[1])
return {'OK'}
`)

// KEYS topo, domains, dom, power (destination). ARGV uuid, name, xml,
// token. Step 3: the paused incoming domain; it replaces the incoming
// domain of an interrupted attempt, never a domain of the host's own.
var incomingScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'OFF'} end
if redis.call('EXISTS', KEYS[3]) == 1 and redis.call('HGET', KEYS[3], 'incoming') ~= '1' then
  return {'EXISTS', redis.call('HGET', KEYS[3], 'state')}
end
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], 'uuid', ARGV[1], 'name', ARGV[2], 'xml', ARGV[3], 'state', 'paused',
  'incoming', '1', 'migration', ARGV[4])
redis.call('SADD', KEYS[2], ARGV[1])
return {'OK'}
`)

// ownedLua starts the scripts of an attempt that must still own its
// record: owner(k, token) is nil when the record in k is in phase copying
// under token, else why not: GONE (no record: a rollback or the abort of a
// dead migration ended it), DEAD (this attempt was declared dead and is
// being aborted) or SUPERSEDED (another attempt or a rollback holds it).
const ownedLua = `
local function owner(k, token)
  local m = redis.call('HMGET', k, 'token', 'phase')
  if not m[2] then return 'GONE' end
  if m[1] ~= token then return 'SUPERSEDED' end
  if m[2] == 'aborting' then return 'DEAD' end
  if m[2] ~= 'copying' then return 'SUPERSEDED' end
  return nil
end
`

// KEYS migration. ARGV token. Step 4, at every step of the copy: the
// attempt shows it is alive (touched now), if it still owns the record.
var touchScript = redis.NewScript(clockLua + ownedLua + `
local why = owner(KEYS[1], ARGV[1])
if why then return {why} end
redis.call('HSET', KEYS[1], 'touched', string.format('%d', now()))
return {'OK'}
`)

// KEYS home, migration. ARGV token, dst. Step 5, the point of no return:
// phase switchover, home = dst, if this attempt still owns the record; the
// staleness clock restarts for the steps that finish it.
var switchoverScript = redis.NewScript(clockLua + ownedLua + `
local why = owner(KEYS[2], ARGV[1])
if why then return {why} end
redis.call('HSET', KEYS[2], 'phase', 'switchover', 'touched', string.format('%d', now()))
redis.call('SET', KEYS[1], ARGV[2])
return {'OK'}
`)

// KEYS migration. ARGV token. While a migration past its switchover pulls
// the rest of the memory (post-copy), its attempt shows it is alive.
var touchSwitchedScript = redis.NewScript(clockLua + `
local m = redis.call('HMGET', KEYS[1], 'token', 'phase')
if m[1] == ARGV[1] and m[2] == 'switchover' then
  redis.call('HSET', KEYS[1], 'touched', string.format('%d', now()))
end
return {'OK'}
`)

// KEYS dom, power (destination). ARGV token, dest_xml. Step 6: the
// incoming domain runs; done already when it runs with dest_xml. On a
// destination that powered off past the switchover the guest died with it:
// the domain stays defined there, shut off, and the answer says OFF.
var promoteScript = redis.NewScript(`
local off = redis.call('EXISTS', KEYS[2]) == 1
local f = redis.call('HMGET', KEYS[1], 'state', 'incoming', 'migration', 'xml')
if f[2] == '1' and f[3] == ARGV[1] then
  if off then
    redis.call('HSET', KEYS[1], 'state', 'shutoff')
  else
    redis.call('HSET', KEYS[1], 'state', 'running')
  end
  redis.call('HDEL', KEYS[1], 'incoming', 'migration')
  if off then return {'OFF'} end
  return {'OK'}
end
if f[2] ~= '1' and (not f[3] or f[3] == '') and f[4] == ARGV[2] then
  if f[1] == 'running' then return {'OK'} end
  if off and f[1] == 'shutoff' then return {'OFF'} end
end
return {'SUPERSEDED'}
`)

// KEYS domains, dom (source). ARGV uuid, token. Step 7: the source domain
// goes, if this migration still holds it; done already when it is gone.
var removeSourceScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SREM', KEYS[1], ARGV[1])
  return {'OK'}
end
if redis.call('HGET', KEYS[2], 'migration') ~= ARGV[2] then return {'SUPERSEDED'} end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[1], ARGV[1])
return {'OK'}
`)

// KEYS migration. ARGV token, ttl ms. Step 8: phase completed; the record
// expires after the ttl.
var completeScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return {'SUPERSEDED'} end
redis.call('HSET', KEYS[1], 'phase', 'completed')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {'OK'}
`)

// Aborting an attempt undoes its own steps only, recognised by its token;
// so does the abort of a dead migration (see reap), with the dead attempt's
// token.

// KEYS domains, dom (destination). ARGV uuid, token.
var abortIncomingScript = redis.NewScript(`
local f = redis.call('HMGET', KEYS[2], 'incoming', 'migration')
if f[1] == '1' and f[2] == ARGV[2] then
  redis.call('DEL', KEYS[2])
  redis.call('SREM', KEYS[1], ARGV[1])
end
return {'OK'}
`)

// KEYS dom (source). ARGV token.
var unmarkSourceScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'migration') == ARGV[1] then redis.call('HDEL', KEYS[1], 'migration') end
return {'OK'}
`)

// KEYS migration. ARGV token.
var abortRecordScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'token', 'phase')
if m[1] == ARGV[1] and (m[2] == 'copying' or m[2] == 'aborting') then redis.call('DEL', KEYS[1]) end
return {'OK'}
`)

// KEYS migration. ARGV bound in ms. The verdict on a migration whose
// attempt may have died: one in phase copying whose attempt last touched
// it more than the bound ago is dead, and enters phase aborting, which no
// attempt can touch or switch over any more; the one call that makes that
// change decides, so concurrent callers cannot disagree. Answers DEAD,
// token, src, dst for a dead migration (one already aborting included: the
// caller that declared it may have died before its cleanup); ORPHANED,
// token, src, dst for one past its switchover whose attempt has not shown
// itself for the bound, which the caller finishes; NONE when no migration
// is in flight; LIVE otherwise (touched lately, or rolling back). A record
// without touched starts its clock now.
var staleScript = redis.NewScript(clockLua + `
local m = redis.call('HMGET', KEYS[1], 'token', 'phase', 'src', 'dst', 'touched')
if not m[2] or m[2] == 'completed' then return {'NONE'} end
if m[2] == 'copying' or m[2] == 'switchover' then
  if not m[5] then
    redis.call('HSET', KEYS[1], 'touched', string.format('%d', now()))
    return {'LIVE'}
  end
  if now() - tonumber(m[5]) <= tonumber(ARGV[1]) then return {'LIVE'} end
  if m[2] == 'switchover' then return {'ORPHANED', m[1], m[3], m[4]} end
  redis.call('HSET', KEYS[1], 'phase', 'aborting')
  m[2] = 'aborting'
end
if m[2] == 'aborting' then return {'DEAD', m[1], m[3], m[4]} end
return {'LIVE'}
`)

// Rollback steps, in order.

// KEYS migration. ARGV src, dst. Step 1: no attempt of this migration may
// switch over any more, and the record stays until the rollback is done.
var rollbackBeginScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'src', 'dst')
if m[1] == ARGV[1] and m[2] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'phase', 'rollback', 'token', '')
  redis.call('PERSIST', KEYS[1])
end
return {'OK'}
`)

// KEYS topo, domains, dom, power (source). ARGV uuid, name, src_xml ("" when
// unknown). Step 2: the source domain runs, restored from the record if a
// switchover removed it; then (a plain SET) its home is the source.
var rollbackSourceScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'OFF'} end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[3], 'state', 'running')
  redis.call('HDEL', KEYS[3], 'migration', 'incoming', 'shutdown_due')
  return {'OK'}
end
if ARGV[3] == '' then return {'NOTFOUND'} end
redis.call('HSET', KEYS[3], 'uuid', ARGV[1], 'name', ARGV[2], 'xml', ARGV[3], 'state', 'running')
redis.call('SADD', KEYS[2], ARGV[1])
return {'OK', 'restored'}
`)

// KEYS topo, domains, dom, power (destination). ARGV uuid. Step 3: no
// trace on the destination.
var rollbackDestScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOHOST'} end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'OFF'} end
redis.call('DEL', KEYS[3])
redis.call('SREM', KEYS[2], ARGV[1])
return {'OK'}
`)

// KEYS migration. Step 4: the record goes, unless a new attempt has
// replaced it meanwhile.
var rollbackEndScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'phase') == 'rollback' then redis.call('DEL', KEYS[1]) end
return {'OK'}
`)

// run runs a script and returns its status code and the rest of its
// answer.
func (d *Driver) run(ctx context.Context, s *redis.Script, keys []string, args ...any) (string, []string, error) {
	return answer(s.Run(ctx, d.rdb, keys, args...))
}

// runEach runs s once per element of keys, with args, in one pipeline, and
// returns each run's answer as run does. A script missing from Redis's
// cache (after a restart, or on a new cluster node) is run again on its
// own, which loads it.
func (d *Driver) runEach(ctx context.Context, s *redis.Script, keys [][]string, args ...any) ([]scriptAnswer, error) {
	pipe := d.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = s.EvalSha(ctx, pipe, k, args...)
	}
	// Exec's error is the first command's; each is looked at below.
	_, _ = pipe.Exec(ctx)
	out := make([]scriptAnswer, len(keys))
	for i, c := range cmds {
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			c = s.Run(ctx, d.rdb, keys[i], args...)
		}
		code, rest, err := answer(c)
		if err != nil {
			return nil, err
		}
		out[i] = scriptAnswer{code, rest}
	}
	return out, nil
}

// scriptAnswer is one answer of runEach.
type scriptAnswer struct {
	code string
	rest []string
}

// answer reads a script's answer: a table of strings whose first element
// is a status code.
func answer(c *redis.Cmd) (string, []string, error) {
	res, err := c.Slice()
	if err != nil {
		return "", nil, err
	}
	out := make([]string, 0, len(res))
	for _, v := range res {
		str, ok := v.(string)
		if !ok {
			return "", nil, fmt.Errorf("sim: script answered %T %v where a string was expected", v, v)
		}
		out = append(out, str)
	}
	if len(out) == 0 {
		return "", nil, fmt.Errorf("sim: script answered nothing")
	}
	return out[0], out[1:], nil
}
