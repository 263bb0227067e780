#!/usr/bin/env node
// ONNX Runtime (CPU) oracle: runs an ONNX model with onnxruntime-node and writes its outputs as
// ONNX TensorProto files, so that reefline's results can be compared with ONNX Runtime's.
//
//   node tests/ort/run_model.js MODEL.onnx [--input NAME=FILE.pb ...] [--output-dir DIR] ...
//
// Inputs not given with --input are generated from --seed (floats standard normal or uniform
// in --float-range, integers uniform in --int-range, except that an integer or bool input whose
// name contains "mask" is all ones and one whose name contains "token_type" all zeros, as a
// sequence model's attention_mask and token_type_ids; --lengths pads them); symbolic dimensions
// take --dim NAME=V, else --batch. A JSON summary (inputs, outputs with statistics, timings)
// goes to stdout, or to --json FILE. With --output-dir, writes output_<i>.pb (TensorProto named
// after the model's i-th output), summary.json, and with --save-inputs input_<i>.pb (the exact
// inputs fed). With --serve it loads the model and then runs once per "run" line on stdin,
// answering "run_ms <ms>" (bench/libml_vs_ort alternates its own runs with these).
//
// Install once: (cd tests/ort && npm install --ignore-scripts). Exit status: 0 success,
// 1 the model failed to load or run, 2 bad usage or an unreadable or unwritable file.
'use strict';

const fs = require('fs');
const path = require('path');

const USAGE = `usage: node run_model.js MODEL.onnx [options]
  --input NAME=FILE     input from an ONNX TensorProto file (.pb); repeatable. A bare FILE
                        is the next model input not yet given
  --seed S              seed for generated inputs (default 1)
  --batch B             size of every symbolic dimension (default 1)
  --dim NAME=V          size of the symbolic dimension NAME (overrides --batch)
  --int-range LO,HI     generated integer inputs are uniform in [LO, HI) (default 0,100);
                        but a generated integer or bool input named *mask* is all ones and one
                        named *token_type* all zeros
  --lengths L0,L1,...   valid length of each batch item (one per item): generated integer and
                        bool inputs of rank >= 2 are 0 past it along dimension 1 (padded ids
                        0, the mask ones then zeros)
  --float-range LO,HI   generated float inputs are uniform in [LO, HI) (default: N(0, 1))
  --output-dir DIR      write output_<i>.pb (or .json), summary.json there
  --output-format F     pb (TensorProto, default) or json ({name, dtype, dims, data})
  --save-inputs         also write input_<i>.pb (or .json) to --output-dir
  --json FILE           write the summary there instead of stdout ('-' for stdout)
  --repeat R            time R more runs after the warm-up; report min and median ms
  --warmup W            untimed runs before the timed ones (default 1)
  --threads T           intra-op threads (default 1)
  --opt LEVEL           graph optimisation: disabled, basic, extended, all (default all)
  --quiet               print no summary
  --serve               after loading, run once for every line "run" read from stdin and
                        print "run_ms <ms>" on stdout; exit at end of input (no summary).
                        For a caller that alternates its own runs with these ones`;

// ---------------------------------------------------------------------------------------------
// Minimal protobuf for onnx.TensorProto: dims (1), data_type (2), float_data (4), int32_data (5),
// int64_data (7), name (8), raw_data (9), double_data (10), uint64_data (11). Other fields are
// skipped on read (external data is refused).

// ONNX TensorProto.DataType <-> onnxruntime tensor type and typed array.
const DTYPES = {
  1: { ort: 'float32', array: Float32Array },
  2: { ort: 'uint8', array: Uint8Array },
  3: { ort: 'int8', array: Int8Array },
  4: { ort: 'uint16', array: Uint16Array },
  5: { ort: 'int16', array: Int16Array },
  6: { ort: 'int32', array: Int32Array },
  7: { ort: 'int64', array: BigInt64Array },
  9: { ort: 'bool', array: Uint8Array },
  10: { ort: 'float16', array: Uint16Array },
  11: { ort: 'float64', array: Float64Array },
  12: { ort: 'uint32', array: Uint32Array },
  13: { ort: 'uint64', array: BigUint64Array },
};
const ORT_TO_ONNX = Object.fromEntries(Object.entries(DTYPES).map(([k, v]) => [v.ort, +k]));

class Reader {
  constructor(buf) {
    this.buf = buf;
    this.pos = 0;
  }
  eof() {
    return this.pos >= this.buf.length;
  }
  varint() {  // as BigInt (int64 fields may use all 64 bits)
    let result = 0n;
    let shift = 0n;
    for (;;) {
      if (this.pos >= this.buf.length) throw new Error('truncated varint');
      const b = this.buf[this.pos++];
      result |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return result;
      shift += 7n;
      if (shift > 63n) throw new Error('varint too long');
    }
  }
  bytes() {
    const n = Number(this.varint());
    if (this.pos + n > this.buf.length) throw new Error('truncated field');
    const out = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }
  skip(wire) {
    if (wire === 0) this.varint();
    else if (wire === 1) this.pos += 8;
    else if (wire === 2) this.bytes();
    else if (wire === 5) this.pos += 4;
    else throw new Error(`unsupported wire type ${wire}`);
  }
}

const toInt64 = (u) => BigInt.asIntN(64, u);

// Reads a repeated scalar field, packed (wire 2) or not: pushes into out.
function readRepeated(r, wire, kind, out) {
  const one = (rr) => {
    if (kind === 'varint') return rr.varint();
    const n = kind === 'float' ? 4 : 8;
    const v = kind === 'float'
      ? Buffer.from(rr.buf.buffer, rr.buf.byteOffset + rr.pos, n).readFloatLE(0)
      : Buffer.from(rr.buf.buffer, rr.buf.byteOffset + rr.pos, n).readDoubleLE(0);
    rr.pos += n;
    return v;
  };
  if (wire === 2) {
    const sub = new Reader(r.bytes());
    while (!sub.eof()) out.push(one(sub));
  } else {
    out.push(one(r));
  }
}

function decodeTensor(buf) {
  const r = new Reader(buf);
  const t = { name: '', dims: [], dataType: 0, raw: null, floats: [], ints32: [], ints64: [],
              doubles: [], uints64: [] };
  while (!r.eof()) {
    const key = Number(r.varint());
    const field = key >>> 3;
    const wire = key & 7;
    switch (field) {
      case 1: { const d = []; readRepeated(r, wire, 'varint', d);
                t.dims.push(...d.map((x) => Number(toInt64(x)))); break; }
      case 2: t.dataType = Number(r.varint()); break;
      case 4: readRepeated(r, wire, 'float', t.floats); break;
      case 5: readRepeated(r, wire, 'varint', t.ints32); break;
      case 7: readRepeated(r, wire, 'varint', t.ints64); break;
      case 8: t.name = r.bytes().toString('utf8'); break;
      case 9: t.raw = r.bytes(); break;
      case 10: readRepeated(r, wire, 'double', t.doubles); break;
      case 11: readRepeated(r, wire, 'varint', t.uints64); break;
      case 13: throw new Error('TensorProto with external data is not supported');
      default: r.skip(wire);
    }
  }
  const dt = DTYPES[t.dataType];
  if (!dt) throw new Error(`unsupported TensorProto data_type ${t.dataType}`);
  const count = t.dims.reduce((a, b) => a * b, 1);
  let data;
  if (t.raw) {
    if (t.raw.length !== count * dt.array.BYTES_PER_ELEMENT)
      throw new Error(`raw_data has ${t.raw.length} bytes, dims ${t.dims} need ` +
                      `${count * dt.array.BYTES_PER_ELEMENT}`);
    data = new dt.array(count);  // copy: raw may be unaligned
    Buffer.from(data.buffer).set(t.raw);
  } else {
    const src = { 1: t.floats, 11: t.doubles, 7: t.ints64, 12: t.uints64, 13: t.uints64 }[t.dataType]
      || t.ints32;
    if (src.length !== count)
      throw new Error(`tensor '${t.name}' has ${src.length} values, dims ${t.dims} need ${count}`);
    data = new dt.array(count);
    for (let i = 0; i < count; ++i) {
      const v = src[i];
      if (dt.array === BigInt64Array) data[i] = toInt64(v);
      else if (dt.array === BigUint64Array) data[i] = v;
      else if (typeof v === 'bigint') data[i] = Number(BigInt.asIntN(32, v));
      else data[i] = v;
    }
  }
  return { name: t.name, dims: t.dims, type: dt.ort, data };
}

function varintBytes(v) {  // v: BigInt or number, encoded as uint64 (negatives: 10 bytes)
  let u = BigInt.asUintN(64, BigInt(v));
  const out = [];
  do {
    let b = Number(u & 0x7fn);
    u >>= 7n;
    if (u) b |= 0x80;
    out.push(b);
  } while (u);
  return out;
}

function encodeTensor(name, type, dims, data) {
  const parts = [];
  for (const d of dims) parts.push(Buffer.from([0x08, ...varintBytes(d)]));  // dims, unpacked
  parts.push(Buffer.from([0x10, ...varintBytes(ORT_TO_ONNX[type])]));        // data_type
  const nameBytes = Buffer.from(name, 'utf8');
  parts.push(Buffer.from([0x42, ...varintBytes(nameBytes.length)]), nameBytes);  // name
  const raw = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  parts.push(Buffer.from([0x4a, ...varintBytes(raw.length)]), raw);          // raw_data
  return Buffer.concat(parts);
}

// ---------------------------------------------------------------------------------------------
// Seeded inputs: mulberry32 (32-bit state, fast in JS), Box-Muller for normals.

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function generate(meta, dims, opts, index) {
  const count = dims.reduce((a, b) => a * b, 1);
  const rand = mulberry32(opts.seed * 1000003 + index * 7919 + 1);
  const dt = Object.values(DTYPES).find((d) => d.ort === meta.type);
  if (!dt) throw new Error(`cannot generate input '${meta.name}' of type ${meta.type}`);
  const data = new dt.array(count);
  if (['float32', 'float64'].includes(meta.type)) {
    if (opts.floatRange) {
      const [lo, hi] = opts.floatRange;
      for (let i = 0; i < count; ++i) data[i] = lo + (hi - lo) * rand();
    } else {
      for (let i = 0; i < count; i += 2) {
        const r = Math.sqrt(-2 * Math.log(1 - rand()));
        const th = 2 * Math.PI * rand();
        data[i] = r * Math.cos(th);
        if (i + 1 < count) data[i + 1] = r * Math.sin(th);
      }
    }
  } else if (meta.type === 'bool') {
    for (let i = 0; i < count; ++i) data[i] = rand() < 0.5 ? 0 : 1;
  } else if (meta.type === 'float16') {
    throw new Error(`generating float16 input '${meta.name}' is not supported; use --input`);
  } else {
    const [lo, hi] = opts.intRange;
    const fixed = /mask/i.test(meta.name) ? 1 : /token_type/i.test(meta.name) ? 0 : null;
    for (let i = 0; i < count; ++i) {
      const v = fixed !== null ? fixed : lo + Math.floor((hi - lo) * rand());
      data[i] = dt.array === BigInt64Array || dt.array === BigUint64Array ? BigInt(v) : v;
    }
  }
  if (meta.type === 'bool' && /mask/i.test(meta.name)) data.fill(1);
  if (opts.lengths && !['float32', 'float64'].includes(meta.type) && dims.length >= 2)
    padToLengths(meta.name, dims, data, opts.lengths);
  return data;
}

// Zeroes [b, t, ...] for t >= lengths[b]: padding as a tokenizer does it (pad id 0, mask 0).
function padToLengths(name, dims, data, lengths) {
  if (lengths.length !== dims[0])
    usage(`--lengths gives ${lengths.length} lengths, input '${name}' has batch ${dims[0]}`);
  const inner = dims.slice(2).reduce((a, b) => a * b, 1);
  const zero = data instanceof BigInt64Array || data instanceof BigUint64Array ? 0n : 0;
  lengths.forEach((len, b) => {
    if (len > dims[1]) usage(`--lengths: ${len} is longer than input '${name}' (${dims[1]})`);
    data.fill(zero, (b * dims[1] + len) * inner, (b + 1) * dims[1] * inner);
  });
}

// ---------------------------------------------------------------------------------------------

function stats(type, dims, data) {
  const s = { count: data.length, nonfinite: 0 };
  if (type === 'float16' || type === 'bool' || data.length === 0) return s;
  let min = Infinity, max = -Infinity, sum = 0, sum2 = 0, n = 0;
  for (let i = 0; i < data.length; ++i) {
    const v = Number(data[i]);
    if (!Number.isFinite(v)) { s.nonfinite++; continue; }
    if (v < min) min = v;
    if (v > max) max = v;
    sum += v; sum2 += v * v; n++;
  }
  if (n) {
    const mean = sum / n;
    Object.assign(s, { min, max, mean, std: Math.sqrt(Math.max(0, sum2 / n - mean * mean)) });
  }
  // Rank-2 float outputs are [batch, classes] logits: softmax statistics per row, and the
  // largest difference between rows (0 when the output does not depend on the input).
  if (dims.length === 2 && type.startsWith('float') && dims[1] > 1 && !s.nonfinite) {
    const [rows, cols] = dims;
    let maxProb = 0, sumMaxProb = 0, sumEntropy = 0, rowDiff = 0;
    const argmax = [];
    for (let r = 0; r < rows; ++r) {
      let m = -Infinity, am = 0;
      for (let c = 0; c < cols; ++c) if (data[r * cols + c] > m) { m = data[r * cols + c]; am = c; }
      let z = 0;
      for (let c = 0; c < cols; ++c) z += Math.exp(data[r * cols + c] - m);
      let ent = 0;
      for (let c = 0; c < cols; ++c) {
        const p = Math.exp(data[r * cols + c] - m) / z;
        if (p > 0) ent -= p * Math.log(p);
      }
      maxProb = Math.max(maxProb, 1 / z);
      sumMaxProb += 1 / z;
      sumEntropy += ent;
      argmax.push(am);
      if (r > 0)
        for (let c = 0; c < cols; ++c)
          rowDiff = Math.max(rowDiff, Math.abs(data[r * cols + c] - data[c]));
    }
    s.softmax = { max_prob: maxProb, mean_max_prob: sumMaxProb / rows,
                  mean_entropy: sumEntropy / rows, max_entropy: Math.log(cols), argmax };
    s.max_row_diff = rowDiff;
  }
  // Rank >= 2: largest difference between batch items (0: the output ignores the input).
  if (dims.length >= 2 && dims[0] > 1 && s.max_row_diff === undefined && n === data.length) {
    const per = data.length / dims[0];
    let d = 0;
    for (let b = 1; b < dims[0]; ++b)
      for (let i = 0; i < per; ++i) d = Math.max(d, Math.abs(Number(data[b * per + i]) - Number(data[i])));
    s.max_row_diff = d;
  }
  return s;
}

function parseArgs(argv) {
  const o = { model: null, inputs: [], seed: 1, batch: 1, dims: {}, intRange: [0, 100],
              floatRange: null, lengths: null, outputDir: null, format: 'pb', saveInputs: false,
              json: '-',
              repeat: 0, warmup: 1, threads: 1, opt: 'all', quiet: false,
              serve: false };
  const pair = (s, what) => {
    const v = s.split(',').map(Number);
    if (v.length !== 2 || v.some(Number.isNaN) || !(v[0] < v[1])) usage(`bad ${what} '${s}'`);
    return v;
  };
  const int = (s, what, min) => {
    const v = Number(s);
    if (!Number.isInteger(v) || v < min) usage(`bad ${what} '${s}'`);
    return v;
  };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    switch (a) {
      case '--input': {
        const v = val();
        const eq = v.indexOf('=');
        o.inputs.push(eq > 0 ? { name: v.slice(0, eq), file: v.slice(eq + 1) } : { name: null, file: v });
        break;
      }
      case '--seed': o.seed = int(val(), '--seed', 0); break;
      case '--batch': o.batch = int(val(), '--batch', 1); break;
      case '--dim': {
        const v = val();
        const eq = v.indexOf('=');
        if (eq <= 0) usage(`bad --dim '${v}'`);
        o.dims[v.slice(0, eq)] = int(v.slice(eq + 1), '--dim', 0);
        break;
      }
      case '--int-range': o.intRange = pair(val(), '--int-range'); break;
      case '--float-range': o.floatRange = pair(val(), '--float-range'); break;
      case '--lengths': o.lengths = val().split(',').map((x) => int(x, '--lengths', 0)); break;
      case '--output-dir': o.outputDir = val(); break;
      case '--output-format': o.format = val(); if (!['pb', 'json'].includes(o.format)) usage('bad --output-format'); break;
      case '--save-inputs': o.saveInputs = true; break;
      case '--json': o.json = val(); break;
      case '--repeat': o.repeat = int(val(), '--repeat', 0); break;
      case '--warmup': o.warmup = int(val(), '--warmup', 1); break;
      case '--threads': o.threads = int(val(), '--threads', 0); break;
      case '--opt': o.opt = val(); if (!['disabled', 'basic', 'extended', 'all'].includes(o.opt)) usage('bad --opt'); break;
      case '--quiet': o.quiet = true; break;
      case '--serve': o.serve = true; break;
      case '-h': case '--help': console.log(USAGE); process.exit(0); break;
      default:
        if (a.startsWith('-') || o.model) usage(`unexpected argument '${a}'`);
        o.model = a;
    }
  }
  if (!o.model) usage('no model given');
  if (o.saveInputs && !o.outputDir) usage('--save-inputs needs --output-dir');
  return o;
}

function usage(msg) {
  console.error(`run_model.js: ${msg}\n${USAGE}`);
  process.exit(2);
}

function loadOrt() {
  try {
    return require('onnxruntime-node');
  } catch (e) {
    console.error(`run_model.js: cannot load onnxruntime-node (${e.message}); ` +
                  `run: (cd ${__dirname} && npm install --ignore-scripts)`);
    process.exit(2);
  }
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const ort = loadOrt();
  const t0 = process.hrtime.bigint();
  let session;
  try {
    session = await ort.InferenceSession.create(o.model, {
      executionProviders: ['cpu'], intraOpNumThreads: o.threads, interOpNumThreads: 1,
      graphOptimizationLevel: o.opt, executionMode: 'sequential' });
  } catch (e) {
    console.error(`run_model.js: cannot load ${o.model}: ${e.message}`);
    process.exit(1);
  }
  const loadMs = Number(process.hrtime.bigint() - t0) / 1e6;

  // Feeds: files first (by name, or bare files in order), then generated ones.
  const metas = session.inputMetadata;
  const given = {};
  for (const inp of o.inputs) {
    let name = inp.name;
    if (name === null) {
      const next = metas.find((m) => !(m.name in given));
      if (!next) usage(`more inputs than the model has (${inp.file})`);
      name = next.name;
    }
    if (!metas.some((m) => m.name === name)) usage(`the model has no input '${name}'`);
    let t;
    try {
      t = decodeTensor(fs.readFileSync(inp.file));
    } catch (e) {
      console.error(`run_model.js: ${inp.file}: ${e.message}`);
      process.exit(2);
    }
    given[name] = new ort.Tensor(t.type, t.data, t.dims);
  }
  const feeds = {};
  metas.forEach((m, i) => {
    if (m.name in given) { feeds[m.name] = given[m.name]; return; }
    if (!m.isTensor) usage(`input '${m.name}' is not a tensor; give it with --input`);
    const dims = m.shape.map((d) => (typeof d === 'number' && d >= 0 ? d
      : (typeof d === 'string' && d in o.dims ? o.dims[d] : o.batch)));
    feeds[m.name] = new ort.Tensor(m.type, generate(m, dims, o, i), dims);
  });

  if (o.serve) {
    await serve(session, feeds);
    return;
  }

  let results;
  const times = [];
  try {
    for (let r = 0; r < (o.repeat > 0 ? o.warmup + o.repeat : 1); ++r) {
      const t = process.hrtime.bigint();
      results = await session.run(feeds);
      times.push(Number(process.hrtime.bigint() - t) / 1e6);
    }
  } catch (e) {
    console.error(`run_model.js: ${o.model}: run failed: ${e.message}`);
    process.exit(1);
  }
  const timed = times.length > 1 ? times.slice(o.warmup).sort((a, b) => a - b) : times;

  const summary = {
    model: o.model, ort_version: ort.env.versions ? ort.env.versions.node : undefined,
    threads: o.threads, opt: o.opt, load_ms: loadMs,
    first_run_ms: times[0],
    run_ms: { min: timed[0], median: timed[Math.floor(timed.length / 2)], runs: timed.length },
    inputs: metas.map((m) => ({ name: m.name, type: feeds[m.name].type, dims: feeds[m.name].dims,
                                source: m.name in given ? 'file' : 'seed' })),
    outputs: session.outputNames.map((name) => {
      const t = results[name];
      return { name, type: t.type, dims: t.dims, stats: stats(t.type, t.dims, t.data) };
    }),
  };

  try {
    if (o.outputDir) {
      fs.mkdirSync(o.outputDir, { recursive: true });
      const write = (prefix, i, name, t) => {
        const file = path.join(o.outputDir, `${prefix}_${i}.${o.format}`);
        if (o.format === 'pb') {
          fs.writeFileSync(file, encodeTensor(name, t.type, t.dims, t.data));
        } else {
          const data = Array.from(t.data, (v) => (typeof v === 'bigint' ? Number(v) : v));
          fs.writeFileSync(file, JSON.stringify({ name, dtype: t.type, dims: t.dims, data }));
        }
      };
      session.outputNames.forEach((name, i) => write('output', i, name, results[name]));
      if (o.saveInputs) metas.forEach((m, i) => write('input', i, m.name, feeds[m.name]));
      fs.writeFileSync(path.join(o.outputDir, 'summary.json'), JSON.stringify(summary, null, 1) + '\n');
    }
    const text = JSON.stringify(summary, null, 1) + '\n';
    if (o.json !== '-') fs.writeFileSync(o.json, text);
    else if (!o.quiet) process.stdout.write(text);
  } catch (e) {
    console.error(`run_model.js: ${e.message}`);
    process.exit(2);
  }
  if (session.release) await session.release();
}

// --serve: one timed run per "run" line on stdin, its time on stdout, until end of input.
async function serve(session, feeds) {
  const rl = require('readline').createInterface({ input: process.stdin, terminal: false });
  for await (const line of rl) {
    if (line.trim() !== 'run') {
      console.error(`run_model.js: --serve: unknown command '${line.trim()}' (expected: run)`);
      process.exit(2);
    }
    const t = process.hrtime.bigint();
    await session.run(feeds);
    process.stdout.write(`run_ms ${Number(process.hrtime.bigint() - t) / 1e6}\n`);
  }
  if (session.release) await session.release();
}

if (require.main === module) {
  main().catch((e) => {
    console.error(`run_model.js: ${e.stack || e}`);
    process.exit(1);
  });
}

module.exports = { decodeTensor, encodeTensor };
