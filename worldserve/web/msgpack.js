// Minimal MessagePack codec for the playground (worldserve's own code, Apache-2.0).
// Covers what the realtime WebSocket uses: nil, booleans, integers, floats, str, bin,
// arrays and maps with string keys. Ext types are refused (the server never sends them).

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder("utf-8", { fatal: true });

class Writer {
  constructor() {
    this.buf = new Uint8Array(256);
    this.view = new DataView(this.buf.buffer);
    this.pos = 0;
  }
  reserve(n) {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.pos));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }
  u8(v) { this.reserve(1); this.view.setUint8(this.pos, v); this.pos += 1; }
  u16(v) { this.reserve(2); this.view.setUint16(this.pos, v); this.pos += 2; }
  u32(v) { this.reserve(4); this.view.setUint32(this.pos, v); this.pos += 4; }
  i8(v) { this.reserve(1); this.view.setInt8(this.pos, v); this.pos += 1; }
  i16(v) { this.reserve(2); this.view.setInt16(this.pos, v); this.pos += 2; }
  i32(v) { this.reserve(4); this.view.setInt32(this.pos, v); this.pos += 4; }
  u64(v) { this.reserve(8); this.view.setBigUint64(this.pos, BigInt(v)); this.pos += 8; }
  i64(v) { this.reserve(8); this.view.setBigInt64(this.pos, BigInt(v)); this.pos += 8; }
  f64(v) { this.reserve(8); this.view.setFloat64(this.pos, v); this.pos += 8; }
  bytes(b) { this.reserve(b.length); this.buf.set(b, this.pos); this.pos += b.length; }
  result() { return this.buf.slice(0, this.pos); }
}

function encodeInt(w, v) {
  if (v >= 0) {
    if (v < 0x80) w.u8(v);
    else if (v < 0x100) { w.u8(0xcc); w.u8(v); }
    else if (v < 0x10000) { w.u8(0xcd); w.u16(v); }
    else if (v < 0x100000000) { w.u8(0xce); w.u32(v); }
    else { w.u8(0xcf); w.u64(v); }
  } else if (v >= -32) w.u8(0xe0 | (v + 32));
  else if (v >= -0x80) { w.u8(0xd0); w.i8(v); }
  else if (v >= -0x8000) { w.u8(0xd1); w.i16(v); }
  else if (v >= -0x80000000) { w.u8(0xd2); w.i32(v); }
  else { w.u8(0xd3); w.i64(v); }
}

function encodeLength(w, n, fix, fixMax, c8, c16, c32) {
  if (fix !== null && n <= fixMax) w.u8(fix | n);
  else if (c8 !== null && n < 0x100) { w.u8(c8); w.u8(n); }
  else if (n < 0x10000) { w.u8(c16); w.u16(n); }
  else { w.u8(c32); w.u32(n); }
}

function encodeValue(w, v) {
  if (v === null || v === undefined) w.u8(0xc0);
  else if (v === false) w.u8(0xc2);
  else if (v === true) w.u8(0xc3);
  else if (typeof v === "number") {
    if (Number.isSafeInteger(v)) encodeInt(w, v);
    else { w.u8(0xcb); w.f64(v); }
  } else if (typeof v === "bigint") encodeInt(w, Number(v));
  else if (typeof v === "string") {
    const b = textEncoder.encode(v);
    encodeLength(w, b.length, 0xa0, 31, 0xd9, 0xda, 0xdb);
    w.bytes(b);
  } else if (v instanceof Uint8Array || v instanceof ArrayBuffer) {
    const b = v instanceof Uint8Array ? v : new Uint8Array(v);
    encodeLength(w, b.length, null, 0, 0xc4, 0xc5, 0xc6);
    w.bytes(b);
  } else if (Array.isArray(v)) {
    encodeLength(w, v.length, 0x90, 15, null, 0xdc, 0xdd);
    for (const item of v) encodeValue(w, item);
  } else if (typeof v === "object") {
    const entries = Object.entries(v).filter(([, item]) => item !== undefined);
    encodeLength(w, entries.length, 0x80, 15, null, 0xde, 0xdf);
    for (const [key, item] of entries) { encodeValue(w, key); encodeValue(w, item); }
  } else throw new TypeError(`msgpack: cannot encode ${typeof v}`);
}

/** Encode a JS value (objects become maps with string keys) into a Uint8Array. */
export function encode(value) {
  const w = new Writer();
  encodeValue(w, value);
  return w.result();
}

class Reader {
  constructor(bytes) {
    this.buf = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
  }
  need(n) {
    if (this.pos + n > this.buf.length) throw new RangeError("msgpack: truncated message");
  }
  take(n, getter) { this.need(n); const v = getter(this.pos); this.pos += n; return v; }
  u8() { return this.take(1, (p) => this.view.getUint8(p)); }
  u16() { return this.take(2, (p) => this.view.getUint16(p)); }
  u32() { return this.take(4, (p) => this.view.getUint32(p)); }
  u64() { return Number(this.take(8, (p) => this.view.getBigUint64(p))); }
  i8() { return this.take(1, (p) => this.view.getInt8(p)); }
  i16() { return this.take(2, (p) => this.view.getInt16(p)); }
  i32() { return this.take(4, (p) => this.view.getInt32(p)); }
  i64() { return Number(this.take(8, (p) => this.view.getBigInt64(p))); }
  f32() { return this.take(4, (p) => this.view.getFloat32(p)); }
  f64() { return this.take(8, (p) => this.view.getFloat64(p)); }
  bytes(n) { this.need(n); const b = this.buf.subarray(this.pos, this.pos + n); this.pos += n; return b; }
  str(n) { return textDecoder.decode(this.bytes(n)); }
}

function decodeArray(r, n) {
  const out = new Array(n);
  for (let i = 0; i < n; i++) out[i] = decodeValue(r);
  return out;
}

function decodeMap(r, n) {
  const out = {};
  for (let i = 0; i < n; i++) {
    const key = decodeValue(r);
    out[String(key)] = decodeValue(r);
  }
  return out;
}

const FIXED = {
  0xc0: () => null, 0xc2: () => false, 0xc3: () => true,
  0xc4: (r) => r.bytes(r.u8()), 0xc5: (r) => r.bytes(r.u16()), 0xc6: (r) => r.bytes(r.u32()),
  0xca: (r) => r.f32(), 0xcb: (r) => r.f64(),
  0xcc: (r) => r.u8(), 0xcd: (r) => r.u16(), 0xce: (r) => r.u32(), 0xcf: (r) => r.u64(),
  0xd0: (r) => r.i8(), 0xd1: (r) => r.i16(), 0xd2: (r) => r.i32(), 0xd3: (r) => r.i64(),
  0xd9: (r) => r.str(r.u8()), 0xda: (r) => r.str(r.u16()), 0xdb: (r) => r.str(r.u32()),
  0xdc: (r) => decodeArray(r, r.u16()), 0xdd: (r) => decodeArray(r, r.u32()),
  0xde: (r) => decodeMap(r, r.u16()), 0xdf: (r) => decodeMap(r, r.u32()),
};

function decodeValue(r) {
  const b = r.u8();
  if (b < 0x80) return b;
  if (b < 0x90) return decodeMap(r, b & 0x0f);
  if (b < 0xa0) return decodeArray(r, b & 0x0f);
  if (b < 0xc0) return r.str(b & 0x1f);
  if (b >= 0xe0) return b - 0x100;
  const fn = FIXED[b];
  if (!fn) throw new TypeError(`msgpack: unsupported type byte 0x${b.toString(16)}`);
  return fn(r);
}

/** Decode one msgpack value from a Uint8Array or ArrayBuffer; bin values stay Uint8Array views. */
export function decode(data) {
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  const r = new Reader(bytes);
  const value = decodeValue(r);
  if (r.pos !== bytes.length) throw new RangeError("msgpack: trailing bytes after the message");
  return value;
}
