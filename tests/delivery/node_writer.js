// A Claude Code-style inbox writer, for contention tests and the benchmark.
//
// Usage: node node_writer.js <node_modules dir> <inbox.json> <writer id> <count> [id prefix]
//
// It appends <count> entries to <inbox.json> the way Claude Code's writeToMailbox does
// (read from its bundled code, v2.1.x): create the file as "[]" with an exclusive
// create, take the proper-lockfile lock (lockfilePath = inbox + ".lock", retries
// {retries: 10, minTimeout: 5, maxTimeout: 100}, stale 10 s), read the array (an
// unparseable file reads as []), push, write "<inbox>.tmp.<hex>" and rename it over the
// inbox, release. Like Claude Code, an append that cannot get the lock (ELOCKED) gives
// up; unlike Claude Code, it says so: the outcome of every append is printed as one
// JSON object on stdout: {writer, ok: [ids], elocked: [ids], errors: [[id, msg]],
// latencies_ms: [...]}.
'use strict';

const path = require('path');
const fs = require('fs/promises');
const crypto = require('crypto');

const [modulesDir, inbox, writerId, countArg, prefixArg] = process.argv.slice(2);
const prefix = prefixArg || writerId; // msg_id prefix: unique per inbox, as Claude Code's random ids are
const lockfile = require(path.join(path.resolve(modulesDir), 'proper-lockfile'));
const LOCK_OPTIONS = { retries: { retries: 10, minTimeout: 5, maxTimeout: 100 }, stale: 10000 };

async function readMailbox(file) {
    try {
        return JSON.parse(await fs.readFile(file, 'utf-8'));
    } catch (err) {
        return []; // ENOENT and SyntaxError both read as an empty inbox
    }
}

async function atomicWrite(file, text) {
    const tmp = `${file}.tmp.${crypto.randomBytes(4).toString('hex')}`;
    const handle = await fs.open(tmp, 'wx');
    try {
        await handle.writeFile(text, 'utf-8');
        await handle.sync();
    } finally {
        await handle.close();
    }
    await fs.rename(tmp, file);
}

async function writeToMailbox(file, message) {
    await fs.mkdir(path.dirname(file), { recursive: true });
    try {
        await fs.writeFile(file, '[]', { encoding: 'utf-8', flag: 'wx' });
    } catch (err) {
        if (err.code !== 'EEXIST') throw err;
    }
    let release;
    try {
        release = await lockfile.lock(file, { lockfilePath: `${file}.lock`, ...LOCK_OPTIONS });
        const messages = await readMailbox(file);
        messages.push({ ...message, msgV: 1, type: 'message', read: false });
        await atomicWrite(file, JSON.stringify(messages, null, 2));
    } finally {
        if (release) await release();
    }
}

async function main() {
    const count = Number(countArg);
    const out = { writer: writerId, ok: [], elocked: [], errors: [], latencies_ms: [] };
    for (let i = 0; i < count; i++) {
        const msgId = `${prefix}-${i}`;
        const started = process.hrtime.bigint();
        try {
            await writeToMailbox(inbox, {
                from: writerId,
                text: `#${i}`,
                timestamp: new Date().toISOString(),
                color: 'green',
                msg_id: msgId,
            });
            out.ok.push(msgId);
        } catch (err) {
            if (err.code === 'ELOCKED') out.elocked.push(msgId);
            else out.errors.push([msgId, String(err)]);
        }
        out.latencies_ms.push(Number(process.hrtime.bigint() - started) / 1e6);
    }
    process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((err) => {
    process.stderr.write(String(err && err.stack ? err.stack : err) + '\n');
    process.exit(1);
});
