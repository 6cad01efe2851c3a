//! Avro binary written straight from a value's `Serialize`, fields in
//! schema order, by a plan compiled once from the schema.
//!
//! apache-avro's schema-aware writer finds each field of a record by name
//! (a hash of the name, then a comparison) and prepares a serializer per
//! field; on an output-heavy stage that was a tenth of the CPU. The structs
//! a stage writes declare their fields in the order of their schema, so the
//! writer here walks the schema's fields by position and only checks that
//! each name is the one it expects. Anything it was not planned for (fields
//! in another order, a skipped field, a union other than `null` and one
//! type, a value of another type) is a [`Mismatch`]: the caller then writes
//! the value with apache-avro, which decides what it means.

use std::fmt;

use apache_avro::Schema;
use serde::ser::{self, Serialize};

/// How the values of one schema are written.
#[derive(Debug)]
pub(super) enum Plan {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Array(Box<Plan>),
    Map(Box<Plan>),
    /// A record's fields, in schema order.
    Record(Vec<(String, Plan)>),
    /// A union of `null` and one other type, which is how an `Option` is
    /// written: the index of the `null` branch, and the other's plan.
    Nullable {
        null_index: u8,
        value: Box<Plan>,
    },
    Enum(Vec<String>),
}

impl Plan {
    /// The plan for `schema`, or `None` if it has a part this writer leaves
    /// to apache-avro (named references, other unions, fixed, decimals,
    /// UUIDs, durations).
    pub(super) fn compile(schema: &Schema) -> Option<Plan> {
        Some(match schema {
            Schema::Null => Plan::Null,
            Schema::Boolean => Plan::Boolean,
            Schema::Int | Schema::Date | Schema::TimeMillis => Plan::Int,
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => Plan::Long,
            Schema::Float => Plan::Float,
            Schema::Double => Plan::Double,
            Schema::Bytes => Plan::Bytes,
            Schema::String => Plan::String,
            Schema::Array(array) => Plan::Array(Box::new(Self::compile(&array.items)?)),
            Schema::Map(map) => Plan::Map(Box::new(Self::compile(&map.types)?)),
            Schema::Record(record) => Plan::Record(
                (record.fields.iter())
                    .map(|field| Some((field.name.clone(), Self::compile(&field.schema)?)))
                    .collect::<Option<_>>()?,
            ),
            Schema::Union(union) => match union.variants() {
                [Schema::Null, other] => Plan::Nullable {
                    null_index: 0,
                    value: Box::new(Self::compile(other)?),
                },
                [other, Schema::Null] => Plan::Nullable {
                    null_index: 1,
                    value: Box::new(Self::compile(other)?),
                },
                _ => return None,
            },
            Schema::Enum(symbols) => Plan::Enum(symbols.symbols.clone()),
            _ => return None,
        })
    }
}

/// Writes `value` as `plan` says to the end of `out`. On a [`Mismatch`],
/// `out` holds a partial value: the caller truncates it.
pub(super) fn write<T: Serialize + ?Sized>(
    plan: &Plan,
    value: &T,
    out: &mut Vec<u8>,
) -> Result<(), Mismatch> {
    value.serialize(Writer { plan, out })
}

/// A value that does not fit the plan as this writer reads it.
#[derive(Debug)]
pub(super) struct Mismatch(String);

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Mismatch {}

impl ser::Error for Mismatch {
    fn custom<T: fmt::Display>(message: T) -> Self {
        Mismatch(message.to_string())
    }
}

fn mismatch<T>(what: &str, plan: &Plan) -> Result<T, Mismatch> {
    Err(Mismatch(format!("{what} where the plan is {plan:?}")))
}

/// Avro's variable-length zig-zag encoding of a long.
fn write_long(value: i64, out: &mut Vec<u8>) {
    let mut n = ((value << 1) ^ (value >> 63)) as u64;
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn write_len(len: usize, out: &mut Vec<u8>) {
    write_long(len as i64, out);
}

struct Writer<'a> {
    plan: &'a Plan,
    out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    /// An `int` (apache-avro writes Rust's narrower integers as one).
    fn int(self, value: i32, what: &str) -> Result<(), Mismatch> {
        match self.plan {
            Plan::Int => write_long(value.into(), self.out),
            plan => return mismatch(what, plan),
        }
        Ok(())
    }

    /// A `long` (`i64` and `u32`, as apache-avro writes them).
    fn long(self, value: i64, what: &str) -> Result<(), Mismatch> {
        match self.plan {
            Plan::Long => write_long(value, self.out),
            plan => return mismatch(what, plan),
        }
        Ok(())
    }
}

impl<'a> ser::Serializer for Writer<'a> {
    type Ok = ();
    type Error = Mismatch;
    type SerializeSeq = Block<'a>;
    type SerializeTuple = ser::Impossible<(), Mismatch>;
    type SerializeTupleStruct = ser::Impossible<(), Mismatch>;
    type SerializeTupleVariant = ser::Impossible<(), Mismatch>;
    type SerializeMap = Block<'a>;
    type SerializeStruct = Fields<'a>;
    type SerializeStructVariant = ser::Impossible<(), Mismatch>;

    fn serialize_bool(self, v: bool) -> Result<(), Mismatch> {
        match self.plan {
            Plan::Boolean => self.out.push(u8::from(v)),
            plan => return mismatch("a bool", plan),
        }
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Result<(), Mismatch> {
        self.int(v.into(), "an i8")
    }

    fn serialize_i16(self, v: i16) -> Result<(), Mismatch> {
        self.int(v.into(), "an i16")
    }

    fn serialize_i32(self, v: i32) -> Result<(), Mismatch> {
        self.int(v, "an i32")
    }

    fn serialize_i64(self, v: i64) -> Result<(), Mismatch> {
        self.long(v, "an i64")
    }

    fn serialize_u8(self, v: u8) -> Result<(), Mismatch> {
        self.int(v.into(), "a u8")
    }

    fn serialize_u16(self, v: u16) -> Result<(), Mismatch> {
        self.int(v.into(), "a u16")
    }

    fn serialize_u32(self, v: u32) -> Result<(), Mismatch> {
        self.long(v.into(), "a u32")
    }

    /// apache-avro writes a `u64` as a fixed of 8 bytes of its own naming.
    fn serialize_u64(self, _v: u64) -> Result<(), Mismatch> {
        mismatch("a u64", self.plan)
    }

    fn serialize_f32(self, v: f32) -> Result<(), Mismatch> {
        match self.plan {
            Plan::Float => self.out.extend_from_slice(&v.to_le_bytes()),
            plan => return mismatch("an f32", plan),
        }
        Ok(())
    }

    fn serialize_f64(self, v: f64) -> Result<(), Mismatch> {
        match self.plan {
            Plan::Double => self.out.extend_from_slice(&v.to_le_bytes()),
            plan => return mismatch("an f64", plan),
        }
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result<(), Mismatch> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(self, v: &str) -> Result<(), Mismatch> {
        match self.plan {
            Plan::String => {
                write_len(v.len(), self.out);
                self.out.extend_from_slice(v.as_bytes());
            }
            plan => return mismatch("a string", plan),
        }
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), Mismatch> {
        match self.plan {
            Plan::Bytes => {
                write_len(v.len(), self.out);
                self.out.extend_from_slice(v);
            }
            plan => return mismatch("bytes", plan),
        }
        Ok(())
    }

    fn serialize_none(self) -> Result<(), Mismatch> {
        match self.plan {
            Plan::Nullable { null_index, .. } => write_len((*null_index).into(), self.out),
            plan => return mismatch("a None", plan),
        }
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Mismatch> {
        match self.plan {
            Plan::Nullable {
                null_index,
                value: plan,
            } => {
                write_len((1 - null_index).into(), self.out);
                value.serialize(Writer {
                    plan,
                    out: self.out,
                })
            }
            plan => mismatch("a Some", plan),
        }
    }

    fn serialize_unit(self) -> Result<(), Mismatch> {
        match self.plan {
            Plan::Null => Ok(()),
            plan => mismatch("a unit", plan),
        }
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Mismatch> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        index: u32,
        variant: &'static str,
    ) -> Result<(), Mismatch> {
        let Plan::Enum(symbols) = self.plan else {
            return mismatch("a unit variant", self.plan);
        };
        // The variant's own index first: it is the symbol's unless the enum
        // skips variants or orders them otherwise.
        let index = index as usize;
        let symbol = match symbols.get(index) {
            Some(symbol) if symbol == variant => index,
            _ => (symbols.iter().position(|symbol| symbol == variant))
                .ok_or_else(|| Mismatch(format!("`{variant}` is not a symbol")))?,
        };
        write_len(symbol, self.out);
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Mismatch> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), Mismatch> {
        mismatch("a newtype variant", self.plan)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Block<'a>, Mismatch> {
        match (self.plan, len) {
            (Plan::Array(items), Some(len)) => Ok(Block::start(items, self.out, len)),
            (plan, _) => mismatch("a sequence", plan),
        }
    }

    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Mismatch> {
        mismatch("a tuple", self.plan)
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Mismatch> {
        mismatch("a tuple struct", self.plan)
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Mismatch> {
        mismatch("a tuple variant", self.plan)
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Block<'a>, Mismatch> {
        match (self.plan, len) {
            (Plan::Map(values), Some(len)) => Ok(Block::start(values, self.out, len)),
            (plan, _) => mismatch("a map", plan),
        }
    }

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Fields<'a>, Mismatch> {
        match self.plan {
            Plan::Record(fields) => Ok(Fields {
                fields: fields.iter(),
                out: self.out,
            }),
            plan => mismatch("a struct", plan),
        }
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Mismatch> {
        mismatch("a struct variant", self.plan)
    }
}

/// An array's items or a map's entries (keys being strings): one block of
/// as many as the sequence or map said it has, then the empty block that
/// ends it (an empty one is the end block alone).
struct Block<'a> {
    /// The plan of the items, or of the map's values.
    plan: &'a Plan,
    out: &'a mut Vec<u8>,
    left: usize,
}

impl<'a> Block<'a> {
    fn start(plan: &'a Plan, out: &'a mut Vec<u8>, len: usize) -> Self {
        if len > 0 {
            write_len(len, out);
        }
        Block {
            plan,
            out,
            left: len,
        }
    }

    /// Counts an item (or entry) off the length announced.
    fn next(&mut self) -> Result<(), Mismatch> {
        self.left = (self.left.checked_sub(1))
            .ok_or_else(|| Mismatch("more items than the length announced".into()))?;
        Ok(())
    }

    fn write<T: Serialize + ?Sized>(&mut self, plan: &Plan, value: &T) -> Result<(), Mismatch> {
        value.serialize(Writer {
            plan,
            out: self.out,
        })
    }

    fn end(self) -> Result<(), Mismatch> {
        if self.left > 0 {
            return Err(Mismatch("fewer items than the length announced".into()));
        }
        self.out.push(0);
        Ok(())
    }
}

impl ser::SerializeSeq for Block<'_> {
    type Ok = ();
    type Error = Mismatch;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Mismatch> {
        self.next()?;
        self.write(self.plan, value)
    }

    fn end(self) -> Result<(), Mismatch> {
        Block::end(self)
    }
}

impl ser::SerializeMap for Block<'_> {
    type Ok = ();
    type Error = Mismatch;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Mismatch> {
        self.next()?;
        self.write(&Plan::String, key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Mismatch> {
        self.write(self.plan, value)
    }

    fn end(self) -> Result<(), Mismatch> {
        Block::end(self)
    }
}

/// A record's fields, each expected in its schema position.
struct Fields<'a> {
    fields: std::slice::Iter<'a, (String, Plan)>,
    out: &'a mut Vec<u8>,
}

impl ser::SerializeStruct for Fields<'_> {
    type Ok = ();
    type Error = Mismatch;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Mismatch> {
        match self.fields.next() {
            Some((name, plan)) if name == key => value.serialize(Writer {
                plan,
                out: self.out,
            }),
            Some((name, _)) => Err(Mismatch(format!(
                "field `{key}` where the schema has `{name}`"
            ))),
            None => Err(Mismatch(format!("field `{key}` past the schema's last"))),
        }
    }

    fn end(mut self) -> Result<(), Mismatch> {
        match self.fields.next() {
            None => Ok(()),
            Some((name, _)) => Err(Mismatch(format!("no field `{name}`"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::writer::datum::GenericDatumWriter;
    use serde::Serialize;
    use std::collections::BTreeMap;

    /// What apache-avro's writer makes of `value`, if anything.
    fn generic<T: Serialize>(schema: &Schema, value: &T) -> Option<Vec<u8>> {
        let writer = GenericDatumWriter::builder(schema)
            .human_readable(false)
            .build()
            .unwrap();
        let mut out = Vec::new();
        writer.write_ser(&mut out, value).ok().map(|_| out)
    }

    fn direct<T: Serialize>(schema: &Schema, value: &T) -> Option<Vec<u8>> {
        let plan = Plan::compile(schema).expect("a plan");
        let mut out = Vec::new();
        write(&plan, value, &mut out).ok().map(|()| out)
    }

    #[derive(Serialize)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    enum Kind {
        Login,
        Logout,
    }

    #[derive(Serialize)]
    struct Inner {
        at: i64,
        kind: Kind,
    }

    #[derive(Serialize)]
    struct Row {
        id: String,
        count: i32,
        total: i64,
        mean: f64,
        ratio: f32,
        flag: bool,
        group: Option<String>,
        missing: Option<f64>,
        parts: Vec<f64>,
        events: Vec<Inner>,
        tags: BTreeMap<String, i64>,
        raw: serde_bytes_like::Bytes,
        last: Option<Inner>,
    }

    /// Bytes serialized as Avro bytes, without another dependency.
    mod serde_bytes_like {
        pub struct Bytes(pub Vec<u8>);
        impl serde::Serialize for Bytes {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&self.0)
            }
        }
    }

    const ROW_SCHEMA: &str = r#"{"type": "record", "name": "Row", "fields": [
        {"name": "id", "type": "string"},
        {"name": "count", "type": "int"},
        {"name": "total", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "mean", "type": "double"},
        {"name": "ratio", "type": "float"},
        {"name": "flag", "type": "boolean"},
        {"name": "group", "type": ["null", "string"], "default": null},
        {"name": "missing", "type": ["double", "null"]},
        {"name": "parts", "type": {"type": "array", "items": "double"}},
        {"name": "events", "type": {"type": "array", "items": {"type": "record", "name": "Inner",
            "fields": [{"name": "at", "type": "long"},
                       {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["LOGIN", "LOGOUT"]}}]}}},
        {"name": "tags", "type": {"type": "map", "values": "long"}},
        {"name": "raw", "type": "bytes"},
        {"name": "last", "type": ["null", {"type": "record", "name": "Last", "fields": [
            {"name": "at", "type": "long"},
            {"name": "kind", "type": {"type": "enum", "name": "LastKind", "symbols": ["LOGOUT", "LOGIN"]}}]}]}
    ]}"#;

    fn row(n: i64) -> Row {
        Row {
            id: format!("user-{n}"),
            count: (n as i32).wrapping_mul(-7919),
            total: n * 1_000_003 - 1,
            mean: n as f64 / 3.0,
            ratio: -(n as f32) / 7.0,
            flag: n % 2 == 0,
            group: (n % 3 != 0).then(|| format!("g{n}")),
            missing: (n % 2 == 0).then_some(1.5),
            parts: (0..n % 4).map(|i| i as f64 * 0.1).collect(),
            events: (0..n % 3)
                .map(|i| Inner {
                    at: i64::MIN + i,
                    kind: if i % 2 == 0 {
                        Kind::Login
                    } else {
                        Kind::Logout
                    },
                })
                .collect(),
            tags: (0..n % 3).map(|i| (format!("t{i}"), i - 1)).collect(),
            raw: serde_bytes_like::Bytes(vec![n as u8; (n % 5) as usize]),
            last: (n % 2 == 1).then_some(Inner {
                at: i64::MAX - n,
                // Its symbols are in the other order: not the variant's index.
                kind: if n % 4 == 1 {
                    Kind::Login
                } else {
                    Kind::Logout
                },
            }),
        }
    }

    #[test]
    fn writes_the_same_bytes_as_apache_avro() {
        let schema = Schema::parse_str(ROW_SCHEMA).unwrap();
        for n in 0..50 {
            let value = row(n);
            let expected = generic(&schema, &value).expect("apache-avro writes it");
            assert_eq!(direct(&schema, &value), Some(expected), "row {n}");
        }
    }

    #[test]
    fn every_topic_schema_has_a_plan() {
        for (topic, schema) in topic_schemas::ALL {
            let schema = Schema::parse_str(schema).unwrap();
            assert!(Plan::compile(&schema).is_some(), "{topic} has no plan");
        }
    }

    #[test]
    fn leaves_what_it_was_not_planned_for_to_apache_avro() {
        #[derive(Serialize)]
        struct Swapped {
            b: i64,
            a: i64,
        }
        #[derive(Serialize)]
        struct Short {
            a: i64,
        }
        #[derive(Serialize)]
        struct Wide {
            a: i64,
            b: i64,
        }
        let schema = Schema::parse_str(
            r#"{"type": "record", "name": "R", "fields": [
                {"name": "a", "type": "long"}, {"name": "b", "type": "int"}]}"#,
        )
        .unwrap();
        assert_eq!(direct(&schema, &Swapped { b: 1, a: 2 }), None);
        assert_eq!(direct(&schema, &Short { a: 1 }), None);
        // An i64 where the schema has an int, which apache-avro refuses too.
        assert_eq!(direct(&schema, &Wide { a: 1, b: 2 }), None);
        assert_eq!(generic(&schema, &Wide { a: 1, b: 2 }), None);
        let general_union = Schema::parse_str(
            r#"{"type": "record", "name": "U", "fields": [
                {"name": "a", "type": ["null", "long", "string"]}]}"#,
        )
        .unwrap();
        assert!(Plan::compile(&general_union).is_none());
    }
}
