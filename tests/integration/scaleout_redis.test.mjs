// scaleout_redis.test.mjs — the registry's Redis failing under load (issue 22): three real `kvgw
// serve` (A, B, C) sharing two real `kvgw worker` processes, their Redis a real primary with a
// replica behind three real redis-sentinel (the gateways know only the sentinels).
//   - the primary paused (SIGSTOP) then resumed mid-load, and stopped (SHUTDOWN) then restarted
//     mid-load: every request is answered, every response received in full is billed exactly
//     once in the merged export, the write decisions made while Redis was away are marked
//     `registry: local` and those made after it returned `registry: shared`; what was written
//     meanwhile reaches Redis (replayed) and is read through another gateway;
//   - SENTINEL FAILOVER mid-load: the gateways follow the new primary, the requests after it are
//     billed as shared, the new primary holds the registrations and the entries; a write made
//     between the promotion and the old primary's demotion is not lost;
//   - at the end `kvgw billing verify` reconciles Redis (the new primary) with every ledger.
//
// Run by CTest (tests/integration/CMakeLists.txt): KVGW_BIN=build/bin/kvgw node --test
// tests/integration/scaleout_redis.test.mjs from the repository root.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  Cluster, MODEL, PREFIX, ADMIN, message, system, metrics, mergedExport, usageMismatch, waitFor, kvgw, redisCli, kill,
} from './cluster_harness.mjs';

const cluster = new Cluster('redis', { sentinel: true });
let A, B, C;
const all = []; // every request of every load, for the final checks

before(async () => {
  await cluster.start();
  [A, B, C] = cluster.gws;
});

after(async () => { await cluster.stop(); });

const extraLedgers = []; // gateways started by a test and gone since
const ledgers = () => [A.ledger, B.ledger, C.ledger, ...extraLedgers];
const sum = async (name) => { let s = 0; for (const g of cluster.gws) s += (await metrics(g)).value(name); return s; };

// Three clients sending requests round robin over A, B and C while during(results) runs: two in
// three have a fresh prefix (a write: the decision needs a claim), one in three a prefix the
// others share. Every request must be answered in full: the gateways keep serving without Redis.
async function withLoad(tag, during) {
  const results = [];
  const shared = [0, 1].map((i) => system(`${tag}-shared-${i}-${process.pid}`));
  let stop = false, n = 0, failure = null;
  const loops = [0, 1, 2].map((c) => (async () => {
    for (let k = c; !stop; k++) {
      const i = n++;
      const g = cluster.gws[k % 3];
      const body = {
        model: MODEL, max_tokens: 1 + (i % 3), stream: i % 2 === 1,
        system: i % 3 === 2 ? shared[i % 2] : system(`${tag}-fresh-${i}-${process.pid}`),
        messages: [{ role: 'user', content: 'x' }],
      };
      const t0 = Date.now();
      const r = await message(g, body);
      r.t0 = t0;
      r.t1 = Date.now();
      r.body = body;
      results.push(r);
      all.push(r);
      if (!r.complete) { failure = `${g.name}: ${r.status} ${r.error ?? JSON.stringify(r.json)}`; stop = true; }
    }
  })());
  try {
    await during(results, () => failure);
  } finally {
    stop = true;
    await Promise.all(loops);
  }
  assert.equal(failure, null, 'every request answered in full');
  return results;
}

// Waits until n requests that started at or after t (and needed a write) have completed.
const writesSince = (results, t) => results.filter((r) => r.complete && r.t0 >= t && r.usage.cache_creation_input_tokens > 0).length;

// Every gateway connected, registered and not fenced.
const allUp = () => waitFor('every gateway\'s registry up', async () => {
  for (const g of cluster.gws) if ((await metrics(g)).value('kvgw_registry_up') !== 1) return false;
  return true;
}, { timeoutMs: 60000, stepMs: 100 });

// The checks of one outage: billed once and exactly, local inside [down, up), shared after back.
async function checkOutage(results, down, up, back, what) {
  const rows = mergedExport(ledgers());
  const byRid = new Map();
  for (const r of rows) {
    assert.ok(!byRid.has(r.request_id), `${r.request_id} billed twice`);
    byRid.set(r.request_id, r);
  }
  let local = 0, shared = 0;
  for (const r of results) {
    const row = byRid.get(r.rid);
    assert.ok(row, `${what}: ${r.rid} (${r.gw}) received in full, not billed`);
    assert.equal(usageMismatch(row, r.usage), null, `${what}: ${r.rid}`);
    const wrote = r.usage.cache_creation_input_tokens > 0;
    if (wrote && r.t0 >= down && r.t1 <= up) {
      assert.equal(row.registry, 'local', `${what}: ${r.rid} (${r.gw}) decided while Redis was away`);
      local++;
    }
    if (wrote && r.t0 >= back) {
      assert.equal(row.registry, 'shared', `${what}: ${r.rid} (${r.gw}) decided after Redis returned`);
      shared++;
    }
    assert.ok(['shared', 'local'].includes(row.registry), row.registry);
  }
  console.log(`${what}: ${results.length} requests, ${local} writes decided locally while Redis was away, ${shared} shared after`);
  assert.ok(local >= 3 && shared >= 3, `${what}: enough decisions on both sides to mean something`);
  return byRid;
}

// A prefix written through one gateway while Redis was away reaches Redis once it is back
// (replayed) and is read through the next gateway.
async function checkReplayed(results, down, up, what) {
  await waitFor('the replay queues to drain', async () => (await sum('kvgw_registry_replay_pending')) === 0, { timeoutMs: 30000, stepMs: 100 });
  assert.equal(await sum('kvgw_registry_replay_dropped_total'), 0, 'nothing dropped from the replay queues');
  const w = results.find((r) => r.complete && r.t0 >= down && r.t1 <= up && r.usage.cache_creation_input_tokens > 0);
  assert.ok(w, `${what}: a prefix was written while Redis was away`);
  const other = cluster.gws[(cluster.gws.findIndex((g) => g.name === w.gw) + 1) % 3];
  const r = await message(other, w.body);
  assert.equal(r.usage.cache_read_input_tokens, w.usage.cache_creation_input_tokens, `${what}: ${other.name} reads what ${w.gw} wrote while Redis was away`);
}

test('Redis paused (SIGSTOP) mid-load, then resumed: served, billed once, degraded decisions marked local', async () => {
  await allUp();
  const localBefore = await sum('kvgw_registry_decisions_total{registry="local"}');
  let down, up, back;
  const results = await withLoad('pause', async (res, failed) => {
    await waitFor('6 responses before the pause', () => res.filter((r) => r.complete).length >= 6 || failed(), { stepMs: 10 });
    cluster.redis.pause();
    down = Date.now();
    try {
      await waitFor('3 writes decided while Redis is paused', () => writesSince(res, down) >= 3 || failed(), { timeoutMs: 60000, stepMs: 20 });
    } finally {
      up = Date.now();
      cluster.redis.resume();
    }
    await allUp();
    back = Date.now();
    await waitFor('3 writes after Redis returned', () => writesSince(res, back) >= 3 || failed(), { timeoutMs: 60000, stepMs: 20 });
  });
  assert.ok(await sum('kvgw_registry_decisions_total{registry="local"}') - localBefore >= 3, 'kvgw_registry_decisions_total{registry="local"} counts them');
  await checkOutage(results, down, up, back, 'SIGSTOP');
  await checkReplayed(results, down, up, 'SIGSTOP');
});

test('Redis stopped (SHUTDOWN) mid-load, then restarted: served, billed once, degraded decisions marked local', async () => {
  await allUp();
  const degradedBefore = await sum('kvgw_registry_degraded_seconds_total');
  let down, up, back;
  const results = await withLoad('stop', async (res, failed) => {
    await waitFor('6 responses before the stop', () => res.filter((r) => r.complete).length >= 6 || failed(), { stepMs: 10 });
    await cluster.redis.stop();
    down = Date.now();
    try {
      await waitFor('3 writes decided while Redis is stopped', () => writesSince(res, down) >= 3 || failed(), { timeoutMs: 60000, stepMs: 20 });
      await waitFor('every gateway to see its registry down', async () => {
        for (const g of cluster.gws) if ((await metrics(g)).value('kvgw_registry_up') !== 0) return false;
        return true;
      }, { timeoutMs: 30000, stepMs: 50 });
    } finally {
      up = Date.now();
      await cluster.redis.restart();
    }
    await allUp();
    back = Date.now();
    await waitFor('3 writes after Redis returned', () => writesSince(res, back) >= 3 || failed(), { timeoutMs: 60000, stepMs: 20 });
  });
  assert.ok(await sum('kvgw_registry_degraded_seconds_total') > degradedBefore, 'kvgw_registry_degraded_seconds_total grew');
  await checkOutage(results, down, up, back, 'SHUTDOWN');
  await checkReplayed(results, down, up, 'SHUTDOWN');
});

let windowWrite = null;
const windowBody = { model: MODEL, max_tokens: 1, system: system(`failover-window-${process.pid}`), messages: [{ role: 'user', content: 'x' }] };

test('Sentinel failover mid-load: the gateways follow the new primary, billed as shared', async () => {
  await allUp();
  const oldPort = cluster.redis.port, newPort = cluster.replica.port;
  let moved;
  const results = await withLoad('failover', async (res, failed) => {
    await waitFor('6 responses before the failover', () => res.filter((r) => r.complete).length >= 6 || failed(), { stepMs: 10 });
    const t0 = Date.now();
    await cluster.sentinels.failover();
    await waitFor('the sentinels to name the new primary', async () => (await cluster.sentinels.currentMaster()) === newPort, { timeoutMs: 60000, stepMs: 100 });
    // A write in the window between the promotion and the old primary's demotion (checked by the
    // test after the next one).
    if (/^master/.test(await redisCli(oldPort, 'ROLE'))) windowWrite = await message(A, windowBody);
    // Each gateway follows the sentinels' +switch-master (or their answer at its next 1 s
    // check), before the old primary is demoted (their INFO period, up to ~10 s).
    await waitFor('every gateway to follow the new primary', async () => {
      for (const g of cluster.gws) {
        const m = await metrics(g);
        if (m.value('kvgw_registry_failovers_total') < 1 || m.value('kvgw_registry_up') !== 1) return false;
      }
      return true;
    }, { timeoutMs: 60000, stepMs: 100 });
    moved = Date.now();
    console.log(`failover: every gateway on the new primary ${moved - t0} ms after SENTINEL FAILOVER`);
    await waitFor('6 writes after the failover', () => writesSince(res, moved) >= 6 || failed(), { timeoutMs: 60000, stepMs: 20 });
  });
  // The gateways left the old primary at its promotion; the sentinels demote it at their next
  // INFO round (up to ~10 s).
  await waitFor('the sentinels to demote the old primary', async () => /^slave/.test(await redisCli(oldPort, 'ROLE')), { timeoutMs: 60000, stepMs: 200 });
  const rows = new Map(mergedExport(ledgers()).map((r) => [r.request_id, r]));
  for (const r of results) {
    const row = rows.get(r.rid);
    assert.ok(row, `${r.rid} received in full, not billed`);
    assert.equal(usageMismatch(row, r.usage), null, r.rid);
    if (r.t0 >= moved && r.usage.cache_creation_input_tokens > 0) assert.equal(row.registry, 'shared', `${r.rid} (${r.gw}) after the failover`);
  }
  // Written on A after the failover, read on B and C: the new primary holds it.
  const keysBefore = new Set((await redisCli(newPort, 'KEYS', `${PREFIX}:e:*`)).split('\n'));
  const body = { model: MODEL, max_tokens: 1, system: system(`after-failover-${process.pid}`), messages: [{ role: 'user', content: 'x' }] };
  const w = await message(A, body);
  assert.ok(w.usage.cache_creation_input_tokens > 0);
  for (const g of [B, C]) {
    const r = await message(g, body);
    assert.equal(r.usage.cache_read_input_tokens, w.usage.cache_creation_input_tokens, `${g.name} reads it through the new primary`);
  }
  const fresh = (await redisCli(newPort, 'KEYS', `${PREFIX}:e:*`)).split('\n').filter((k) => k && !keysBefore.has(k));
  assert.ok(fresh.length >= 1, 'the entry is on the new primary');
  for (const g of cluster.gws) assert.ok(await redisCli(newPort, 'GET', `${PREFIX}:gw:${g.instance}`), `${g.instance} registered on the new primary`);
});

// A write committed between the promotion and the old primary's demotion (up to the sentinels'
// 10 s INFO period) landed on the old primary and was lost when it resynced from the new one: a
// gateway whose replica lacked it (a restarted or added one) billed that prefix as a second
// write. The gateways now follow the sentinels' +switch-master (and ask them every second), and
// send their recent commits again to the new primary (registry.failover_replay).
test('a write committed between the promotion and the demotion is not lost', async () => {
  assert.ok(windowWrite, 'a write landed in the failover window');
  assert.ok(windowWrite.complete && windowWrite.usage.cache_creation_input_tokens > 0);
  const D = await cluster.startGateway('d');
  cluster.gws.push(D);
  extraLedgers.push(D.ledger);
  try {
    await cluster.ready(D);
    const r = await message(D, windowBody);
    // D's event shipped before D stops (a stop leaves the rest to its next start, and D has
    // none): the final verify expects every ledger's events in Redis, D's too.
    await waitFor('D to ship its ledger', async () => (await metrics(D)).value('kvgw_billing_shipper_lag_events') === 0 && (await metrics(D)).has('kvgw_billing_shipper_lag_events'), { timeoutMs: 30000, stepMs: 50 });
    assert.equal(r.usage.cache_read_input_tokens, windowWrite.usage.cache_creation_input_tokens, 'a fresh gateway reads the prefix written in the window');
  } finally {
    await kill(D.proc, 'SIGTERM');
    cluster.gws.splice(cluster.gws.indexOf(D), 1);
  }
});

test('kvgw billing verify: Redis (the primary now) agrees with every ledger', async () => {
  const port = await cluster.sentinels.currentMaster();
  const args = ['billing', 'verify', ...ledgers().flatMap((l) => ['--ledger', l]),
    '--redis', `127.0.0.1:${port}`, '--prefix', PREFIX];
  // The shippers catch up in the background: wait (bounded) until every instance's shipped
  // stream holds as many events as the ledgers, then verify.
  const nLedger = mergedExport(ledgers()).length;
  await waitFor('the shippers to ship every ledger event', () => mergedExport([], ['--redis', `127.0.0.1:${port}`, '--prefix', PREFIX]).length >= nLedger,
    { timeoutMs: 30000, stepMs: 250 });
  const v = kvgw(args);
  assert.equal(v.code, 0, `kvgw billing verify:\n${v.stdout}\n${v.stderr}`);
  // And the merged export holds every request answered in full exactly once.
  const rows = mergedExport(ledgers());
  const ids = rows.map((r) => r.request_id);
  assert.equal(new Set(ids).size, ids.length, 'no request billed twice');
  const billed = new Set(ids);
  for (const r of all) if (r.complete) assert.ok(billed.has(r.rid), `${r.rid} received in full, not billed`);
  // `kvgw billing export --redis` (every instance's shipped stream) gives the same rows.
  const fromRedis = mergedExport([], ['--redis', `127.0.0.1:${port}`, '--prefix', PREFIX]);
  assert.equal(fromRedis.length, rows.length, 'as many rows from Redis as in the ledgers');
  const byEvent = new Map(fromRedis.map((r) => [r.event_id, r]));
  for (const r of rows) assert.deepEqual(byEvent.get(r.event_id), r, `${r.event_id}: the same row from Redis`);
  // /admin/v1/usage?scope=cluster on every gateway (through the new primary): the same rows.
  for (const g of cluster.gws) {
    const r = await fetch(`${g.base}/admin/v1/usage?scope=cluster&format=jsonl`, { headers: { authorization: `Bearer ${ADMIN}` } });
    const text = await r.text();
    assert.equal(r.status, 200, text);
    const view = text.split('\n').filter(Boolean).map((l) => JSON.parse(l));
    assert.deepEqual(view, rows, `${g.name}'s cluster view is the merged export`);
  }
});
