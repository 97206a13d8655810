#pragma once

#include "sluice/state/redis_client.hpp"

// The Lua scripts that keep limits in Redis. Each runs atomically on the
// server, reads the time from Redis itself (one clock for every instance),
// and stores a TAT as the decimal nanoseconds since the epoch. Lua numbers
// are doubles, exact to 2^53, so the scripts only ever add and compare
// differences from now (seconds and nanoseconds apart), never whole epoch
// nanoseconds; the divisions of the GCRA are left to auth::Gcra and
// auth::TokenBucket in C++, fed the TATs the scripts report.
namespace sluice::state {

// One call per client key's or deployment's budget: what earlier requests
// reserved and did not spend, then the requests to judge.
// KEYS: rpm TAT, tpm TAT, permits held (a hash: holder -> "count expiry_ms",
// one entry per worker of every instance).
// ARGV: interval ns (0 = no rpm), window ns, tpm limited (0|1),
// max_parallel (0 = none), lease TTL ms, most tpm debt ns, the caller's
// holder name, the permits the caller holds (before this call's requests),
// the number S of settlements; then S settlements, in order: ns to add to
// the tpm TAT (negative gives back); then for each request to judge, in
// order: the estimate's cost in ns (0 = reserves nothing).
// Returns {refused, rpm owed ns, tpm owed ns} for each request, one after
// the other: refused 0 = admitted (and charged, a permit counted to the
// caller), 1 = max_parallel, 2 = rpm, 3 = tpm; the owed values are how far
// each TAT stood ahead of now before that request, after the settlements;
// then, last, the permits in use across the holders after the call (0
// without max_parallel). A call without requests returns nothing.
// With max_parallel, the caller's entry is written with its count after
// the call (or removed at zero), good for the lease TTL.
const Script& budget_script();

// KEYS: permit hashes. ARGV: TTL ms, holder name. Pushes the holder's
// entry in each, where it still is, TTL ms past now.
const Script& renew_script();

// Cooldowns, one hash per deployment ({until, probe, probe_at}, in Redis's
// milliseconds). KEYS: that hash.
// ARGV: "set", ms: cooled down for ms from now (a later end stands); any
// probe claim is cleared, the next end needs a new probe.
// ARGV: "ok": the probe succeeded, the deployment is back everywhere.
const Script& cooldown_script();

// KEYS: the deployments' cooldown hashes. ARGV: instance id, probe
// timeout ms. Returns {state, ms} per key: 0 not cooled down; 1 cooled
// down for ms more; 2 the cooldown is over and this instance probes (the
// claim is taken here, once, across all instances); 3 another instance
// probes. A claim older than the probe timeout passes to the next poller.
const Script& cooldown_poll_script();

}  // namespace sluice::state
