// An app on the official OpenFeature Node flagd provider (@openfeature/flagd-provider), in-process, configured
// only from its environment: `eval_probe.js FLAG:KIND[:KEY=VALUE,...]...` evaluates each flag every
// PROBE_EVERY_MS (100) and prints a JSON line at start-up and whenever a value or an error changes; PROBE_FOR_S
// ends it (else SIGTERM does), with a summary line. The same protocol as tools/flagd-probe and eval_probe.py.
'use strict';
const { OpenFeature } = require('@openfeature/server-sdk');
const { FlagdProvider } = require('@openfeature/flagd-provider');

function parse(arg) {
  const [flag, kind, fields] = [arg.split(':')[0], arg.split(':')[1], arg.split(':').slice(2).join(':')];
  if (!flag || !['bool', 'string'].includes(kind)) {
    console.error(`eval_probe: ${JSON.stringify(arg)} is not FLAG:bool|string[:KEY=VALUE,...]`);
    process.exit(2);
  }
  const context = { targetingKey: 'probe' };
  for (const pair of (fields || '').split(',').filter(Boolean)) {
    const at = pair.indexOf('=');
    context[pair.slice(0, at)] = pair.slice(at + 1);
  }
  return { label: arg, flag, kind, context };
}

const say = (line) => process.stdout.write(JSON.stringify(line) + '\n');
const now = () => Date.now() / 1000;

async function main() {
  const probes = process.argv.slice(2).map(parse);
  if (probes.length === 0) {
    console.error('usage: eval_probe.js FLAG:KIND[:KEY=VALUE,...]...');
    process.exit(2);
  }
  const every = Number(process.env.PROBE_EVERY_MS || 100);
  const until = process.env.PROBE_FOR_S ? now() + Number(process.env.PROBE_FOR_S) : null;
  let stop = false;
  process.on('SIGTERM', () => { stop = true; });
  try {
    await OpenFeature.setProviderAndWait(new FlagdProvider());
  } catch (e) {
    say({ event: 'error', t: now(), message: String(e && e.message || e) });
    process.exit(3);
  }
  const client = OpenFeature.getClient();
  say({ event: 'ready', t: now() });
  let rounds = 0;
  let failedRounds = 0;
  let last = null;
  for (;;) {
    const values = {};
    const failed = [];
    for (const p of probes) {
      const d = p.kind === 'bool'
        ? await client.getBooleanDetails(p.flag, false, p.context)
        : await client.getStringDetails(p.flag, '', p.context);
      if (d.errorCode) {
        values[p.label] = null;
        failed.push({ label: p.label, error: `${d.errorCode}: ${d.errorMessage}` });
      } else {
        values[p.label] = d.value;
      }
    }
    rounds += 1;
    if (failed.length) failedRounds += 1;
    const seen = JSON.stringify({ values, failed });
    if (seen !== last) {
      say({ event: 'values', t: now(), values, failed });
      last = seen;
    }
    if (stop || (until !== null && now() >= until)) break;
    await new Promise((r) => setTimeout(r, every));
  }
  say({ event: 'done', t: now(), rounds, failed_rounds: failedRounds });
  await OpenFeature.close();
  process.exit(0);
}

main();
