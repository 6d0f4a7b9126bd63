// Sparkplug B payloads (sparkplug_b.proto of Sparkplug 3.0) read in the
// page: the gateway sends the bytes it routes and the page decodes them,
// so reading metrics costs the gateway nothing and only pages that show
// them pay for it.  A protobuf reader driven by one table of the .proto's
// fields, and each datatype's value as mqttgw.wire.sparkplug.payload
// gives it.  No DOM here: node runs it in the tests.

export class Malformed extends Error {}

export const DATATYPES = [
  "Unknown", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64",
  "Float", "Double", "Boolean", "String", "DateTime", "Text", "UUID", "DataSet", "Bytes",
  "File", "Template", "PropertySet", "PropertySetList", "Int8Array", "Int16Array",
  "Int32Array", "Int64Array", "UInt8Array", "UInt16Array", "UInt32Array", "UInt64Array",
  "FloatArray", "DoubleArray", "BooleanArray", "StringArray", "DateTimeArray",
];

// message -> field number -> [name, kind, repeated]; a kind is a scalar
// ("uint" covers uint32 and uint64) or another message.
const FIELDS = {
  Payload: { 1: ["timestamp", "uint"], 2: ["metrics", "Metric", true], 3: ["seq", "uint"], 4: ["uuid", "string"], 5: ["body", "bytes"] },
  Metric: {
    1: ["name", "string"], 2: ["alias", "uint"], 3: ["timestamp", "uint"], 4: ["datatype", "uint"],
    5: ["is_historical", "bool"], 6: ["is_transient", "bool"], 7: ["is_null", "bool"],
    8: ["metadata", "MetaData"], 9: ["properties", "PropertySet"], 10: ["int_value", "uint"],
    11: ["long_value", "uint"], 12: ["float_value", "float"], 13: ["double_value", "double"],
    14: ["boolean_value", "bool"], 15: ["string_value", "string"], 16: ["bytes_value", "bytes"],
    17: ["dataset_value", "DataSet"], 18: ["template_value", "Template"],
  },
  MetaData: {
    1: ["is_multi_part", "bool"], 2: ["content_type", "string"], 3: ["size", "uint"], 4: ["seq", "uint"],
    5: ["file_name", "string"], 6: ["file_type", "string"], 7: ["md5", "string"], 8: ["description", "string"],
  },
  DataSet: { 1: ["num_of_columns", "uint"], 2: ["columns", "string", true], 3: ["types", "uint", true], 4: ["rows", "Row", true] },
  Row: { 1: ["elements", "DataSetValue", true] },
  DataSetValue: {
    1: ["int_value", "uint"], 2: ["long_value", "uint"], 3: ["float_value", "float"],
    4: ["double_value", "double"], 5: ["boolean_value", "bool"], 6: ["string_value", "string"],
  },
  Template: {
    1: ["version", "string"], 2: ["metrics", "Metric", true], 3: ["parameters", "Parameter", true],
    4: ["template_ref", "string"], 5: ["is_definition", "bool"],
  },
  Parameter: {
    1: ["name", "string"], 2: ["type", "uint"], 3: ["int_value", "uint"], 4: ["long_value", "uint"],
    5: ["float_value", "float"], 6: ["double_value", "double"], 7: ["boolean_value", "bool"], 8: ["string_value", "string"],
  },
  PropertySet: { 1: ["keys", "string", true], 2: ["values", "PropertyValue", true] },
  PropertyValue: {
    1: ["type", "uint"], 2: ["is_null", "bool"], 3: ["int_value", "uint"], 4: ["long_value", "uint"],
    5: ["float_value", "float"], 6: ["double_value", "double"], 7: ["boolean_value", "bool"],
    8: ["string_value", "string"], 9: ["propertyset_value", "PropertySet"], 10: ["propertysets_value", "PropertySetList"],
  },
  PropertySetList: { 1: ["propertyset", "PropertySet", true] },
};

// The wire type each kind comes as; a field on another is skipped, as
// protobuf keeps it among the unknown fields.
const WIRE = { uint: 0, bool: 0, float: 5, double: 1, string: 2, bytes: 2 };
// Templates hold metrics that hold templates: nesting is bounded.
const MAX_DEPTH = 32;
const text = new TextDecoder();

class Reader {
  constructor(bytes) {
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.at = 0;
  }

  // A Number while it is exact, else a BigInt.
  varint() {
    let value = 0, scale = 1, big = null;
    for (let i = 0; i < 10; i++) {
      if (this.at >= this.bytes.length) throw new Malformed("truncated varint");
      const byte = this.bytes[this.at++];
      if (big === null && i < 7) value += (byte & 127) * scale;
      else {
        if (big === null) big = BigInt(value);
        big |= BigInt(byte & 127) << BigInt(7 * i);
      }
      scale *= 128;
      if (!(byte & 128)) {
        if (big === null) return value;
        big = BigInt.asUintN(64, big);
        return big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
      }
    }
    throw new Malformed("varint longer than 10 bytes");
  }

  take(n) {
    if (n > this.bytes.length - this.at) throw new Malformed("field runs past the end");
    const out = this.bytes.subarray(this.at, this.at + n);
    this.at += n;
    return out;
  }

  skip(wire) {
    if (wire === 0) this.varint();
    else if (wire === 1) this.take(8);
    else if (wire === 2) this.take(Number(this.varint()));
    else if (wire === 5) this.take(4);
    else throw new Malformed(`wire type ${wire}`);
  }
}

function scalar(reader, kind) {
  if (kind === "uint") return reader.varint();
  if (kind === "bool") return reader.varint() !== 0;
  const at = reader.at;
  if (kind === "float") return reader.take(4) && reader.view.getFloat32(at, true);
  if (kind === "double") return reader.take(8) && reader.view.getFloat64(at, true);
  const bytes = reader.take(Number(reader.varint()));
  return kind === "string" ? text.decode(bytes) : bytes.slice();
}

function message(bytes, name, depth) {
  if (depth > MAX_DEPTH) throw new Malformed("nested too deep");
  const fields = FIELDS[name];
  const reader = new Reader(bytes);
  const out = {};
  for (const [, [field, , repeated]] of Object.entries(fields)) if (repeated) out[field] = [];
  while (reader.at < bytes.length) {
    const key = reader.varint();
    const number = Math.floor(Number(key) / 8), wire = Number(key) % 8;
    const found = fields[number];
    if (number === 0) throw new Malformed("field number 0");
    if (!found) {
      reader.skip(wire);
      continue;
    }
    const [field, kind, repeated] = found;
    let values;
    if (kind in WIRE) {
      if (wire === 2 && repeated && WIRE[kind] !== 2) {
        // A packed repeated scalar.
        const inner = new Reader(reader.take(Number(reader.varint())));
        values = [];
        while (inner.at < inner.bytes.length) values.push(scalar(inner, kind));
      } else if (wire === WIRE[kind]) {
        values = [scalar(reader, kind)];
      } else {
        reader.skip(wire);
        continue;
      }
    } else if (wire === 2) {
      values = [message(reader.take(Number(reader.varint())), kind, depth + 1)];
    } else {
      reader.skip(wire);
      continue;
    }
    if (repeated) out[field].push(...values);
    else out[field] = values[values.length - 1];
  }
  return out;
}

// The Payload in bytes (a Uint8Array), or Malformed.
export function decode(bytes) {
  try {
    return message(bytes, "Payload", 0);
  } catch (e) {
    if (e instanceof Malformed) throw e;
    throw new Malformed(String(e));
  }
}

const PACKED = {
  Int8Array: [1, "getInt8"], Int16Array: [2, "getInt16"], Int32Array: [4, "getInt32"],
  Int64Array: [8, "getBigInt64"], UInt8Array: [1, "getUint8"], UInt16Array: [2, "getUint16"],
  UInt32Array: [4, "getUint32"], UInt64Array: [8, "getBigUint64"], FloatArray: [4, "getFloat32"],
  DoubleArray: [8, "getFloat64"], DateTimeArray: [8, "getBigInt64"],
};

function exact(big) {
  return big >= BigInt(Number.MIN_SAFE_INTEGER) && big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
}

function unpack(type, bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (type in PACKED) {
    const [size, get] = PACKED[type];
    const out = [];
    for (let at = 0; at + size <= bytes.length; at += size) {
      const value = view[get](at, true);
      out.push(typeof value === "bigint" ? exact(value) : value);
    }
    return type === "DateTimeArray" ? out.map((ms) => new Date(Number(ms))) : out;
  }
  if (type === "BooleanArray") {
    if (bytes.length < 4) throw new Malformed("BooleanArray: no count");
    const count = view.getUint32(0, true);
    if (bytes.length - 4 !== Math.ceil(count / 8)) throw new Malformed(`${count} booleans in ${bytes.length - 4} bytes`);
    return Array.from({ length: count }, (_, i) => (bytes[4 + (i >> 3)] & (0x80 >> (i & 7))) !== 0);
  }
  // StringArray: NUL-terminated.
  if (bytes.length && bytes[bytes.length - 1] !== 0) throw new Malformed("StringArray: unterminated string");
  return text.decode(bytes).split("\0").slice(0, -1);
}

const FIELD = {
  Int8: "int_value", Int16: "int_value", Int32: "int_value", UInt8: "int_value", UInt16: "int_value",
  UInt32: "int_value", Int64: "long_value", UInt64: "long_value", DateTime: "long_value",
  Float: "float_value", Double: "double_value", Boolean: "boolean_value", String: "string_value",
  Text: "string_value", UUID: "string_value", Bytes: "bytes_value", File: "bytes_value",
  DataSet: "dataset_value", Template: "template_value", PropertySet: "propertyset_value",
  PropertySetList: "propertysets_value",
};

const INTEGER = new Set(["int_value", "long_value"]);

// The value a Metric (PropertyValue, Parameter, DataSetValue) holds as
// datatype (a number): a Number, BigInt (64-bit integers past 2**53),
// boolean, string, Date, Uint8Array, array, or the nested message; null
// when it holds none.
export function valueOf(holder, datatype) {
  if (holder.is_null) return null;
  const type = DATATYPES[datatype];
  if (type && type.endsWith("Array")) return holder.bytes_value ? unpack(type, holder.bytes_value) : null;
  const field = FIELD[type];
  let value = field && holder[field];
  // Writers differ on where some integers go (Tahu's JavaScript puts
  // UInt32 in long_value): the other integer field is read too.
  if (value === undefined && INTEGER.has(field)) value = holder[field === "int_value" ? "long_value" : "int_value"];
  if (value === undefined) return null;
  if (type === "Int8" || type === "Int16" || type === "Int32") return Number(BigInt.asIntN(32, BigInt(value)));
  if (type === "Int64") return exact(BigInt.asIntN(64, BigInt(value)));
  if (type === "DateTime") return new Date(Number(value));
  return value;
}

// Characters of a value shown; the rest is cut.
const MAX_SHOWN = 500;

// A value as one line of text for the page.
export function display(value, datatype) {
  const type = DATATYPES[datatype] || `datatype ${datatype}`;
  if (value === null || value === undefined) return "null";
  if (value instanceof Date) return Number.isNaN(value.getTime()) ? "invalid date" : value.toISOString();
  if (value instanceof Uint8Array) return `${value.length} bytes`;
  if (Array.isArray(value)) {
    const shown = value.slice(0, 8).map((v) => display(v, 0));
    return `[${shown.join(", ")}${value.length > 8 ? `, … (${value.length})` : ""}]`;
  }
  if (type === "Float") return String(Number(value.toPrecision(7)));
  if (type === "DataSet") return `DataSet: ${value.rows.length} rows × ${value.columns.length} columns (${value.columns.join(", ")})`;
  if (type === "Template") return `Template${value.template_ref ? ` ${value.template_ref}` : ""}: ${value.metrics.length} metrics`;
  if (type === "PropertySet") {
    return value.keys.map((key, i) => {
      const property = value.values[i] || {};
      return `${key}=${display(valueOf(property, property.type), property.type)}`;
    }).join(", ");
  }
  if (type === "PropertySetList") return `${value.propertyset.length} property sets`;
  const out = String(value);
  return out.length > MAX_SHOWN ? `${out.slice(0, MAX_SHOWN)}…` : out;
}
