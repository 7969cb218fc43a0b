//! Modbus register values: the types a register map names and the byte and
//! word orders devices use, in both directions. The source decodes with it
//! and the Modbus simulator encodes with it, so the two cannot disagree on
//! what `CDAB` means.
//!
//! Orders name where the bytes of a big-endian value `A B C D` (most
//! significant first) sit in the registers, two bytes per register:
//! `ABCD` as is, `DCBA` fully reversed, `BADC` bytes swapped within each
//! register, `CDAB` registers reversed. For 64-bit values the same two
//! rules (reverse the registers, swap the bytes within each) apply to all
//! four registers; for 16-bit values only the swap matters. Strings are
//! two ASCII characters per register, first register first; `BADC` and
//! `DCBA` swap the two characters within each register.

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

/// The value type of a register map entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueType {
    Bool,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F32,
    F64,
    String,
}

impl ValueType {
    /// Registers the value spans; `length` is a string's register count.
    pub fn registers(self, length: u16) -> u16 {
        match self {
            ValueType::Bool | ValueType::U16 | ValueType::I16 => 1,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 2,
            ValueType::U64 | ValueType::I64 | ValueType::F64 => 4,
            ValueType::String => length,
        }
    }

    pub fn is_number(self) -> bool {
        !matches!(self, ValueType::Bool | ValueType::String)
    }
}

/// Byte and word order (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Order {
    #[default]
    Abcd,
    Dcba,
    Badc,
    Cdab,
}

impl Order {
    fn reverses_registers(self) -> bool {
        matches!(self, Order::Dcba | Order::Cdab)
    }

    fn swaps_bytes(self) -> bool {
        matches!(self, Order::Dcba | Order::Badc)
    }
}

/// A reply that does not make a value.
#[derive(Debug, Clone, PartialEq)]
pub enum DecodeError {
    /// Fewer registers than the type needs.
    Short { want: usize, got: usize },
    /// A float that JSON cannot carry (NaN, infinity), or a scaled result
    /// that overflowed.
    NotFinite,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Short { want, got } => write!(f, "needs {want} registers, got {got}"),
            DecodeError::NotFinite => f.write_str("not a finite number"),
        }
    }
}

/// The value's bytes most significant first, from registers in `order`.
fn canonical_bytes(words: &[u16], order: Order) -> Vec<u8> {
    let mut words = words.to_vec();
    if order.reverses_registers() {
        words.reverse();
    }
    words
        .iter()
        .flat_map(|w| {
            let [hi, lo] = w.to_be_bytes();
            if order.swaps_bytes() { [lo, hi] } else { [hi, lo] }
        })
        .collect()
}

/// Registers in `order` holding the value's bytes (most significant first).
fn registers_of(bytes: &[u8], order: Order) -> Vec<u16> {
    let mut words: Vec<u16> = bytes
        .chunks(2)
        .map(|pair| {
            let (hi, lo) = (pair[0], pair.get(1).copied().unwrap_or(0));
            if order.swaps_bytes() {
                u16::from_be_bytes([lo, hi])
            } else {
                u16::from_be_bytes([hi, lo])
            }
        })
        .collect();
    if order.reverses_registers() {
        words.reverse();
    }
    words
}

/// Decodes a register value. `words` must hold at least the type's
/// registers (`length` for strings); extra registers are ignored.
pub fn decode(
    ty: ValueType,
    order: Order,
    length: u16,
    words: &[u16],
) -> Result<Value, DecodeError> {
    let want = usize::from(ty.registers(length));
    let Some(words) = words.get(..want) else {
        return Err(DecodeError::Short { want, got: words.len() });
    };
    if ty == ValueType::String {
        let mut bytes = Vec::with_capacity(want * 2);
        for w in words {
            let [hi, lo] = w.to_be_bytes();
            bytes.extend(if order.swaps_bytes() { [lo, hi] } else { [hi, lo] });
        }
        let text = String::from_utf8_lossy(&bytes);
        return Ok(Value::from(text.trim_end_matches(['\0', ' ']).to_owned()));
    }
    let b = canonical_bytes(words, order);
    let n = |i: usize| b[i];
    let value = match ty {
        ValueType::Bool => Value::from(words[0] != 0),
        ValueType::U16 => Value::from(u16::from_be_bytes([n(0), n(1)])),
        ValueType::I16 => Value::from(i16::from_be_bytes([n(0), n(1)])),
        ValueType::U32 => Value::from(u32::from_be_bytes([n(0), n(1), n(2), n(3)])),
        ValueType::I32 => Value::from(i32::from_be_bytes([n(0), n(1), n(2), n(3)])),
        ValueType::F32 => finite(f64::from(f32::from_be_bytes([n(0), n(1), n(2), n(3)])))?,
        ValueType::U64 => Value::from(u64::from_be_bytes(eight(&b))),
        ValueType::I64 => Value::from(i64::from_be_bytes(eight(&b))),
        ValueType::F64 => finite(f64::from_be_bytes(eight(&b)))?,
        ValueType::String => unreachable!("handled above"),
    };
    Ok(value)
}

fn eight(b: &[u8]) -> [u8; 8] {
    let mut out = [0; 8];
    out.copy_from_slice(&b[..8]);
    out
}

fn finite(x: f64) -> Result<Value, DecodeError> {
    serde_json::Number::from_f64(x).map(Value::Number).ok_or(DecodeError::NotFinite)
}

/// `raw * scale + offset` for numbers, when either is set; other values
/// pass unchanged.
pub fn scale(value: Value, scale: f64, offset: f64) -> Result<Value, DecodeError> {
    if scale == 1.0 && offset == 0.0 {
        return Ok(value);
    }
    match value.as_f64() {
        Some(raw) => finite(raw * scale + offset),
        None => Ok(value),
    }
}

/// Registers holding `value` as `ty` in `order` (strings padded with NULs
/// or cut to `length` registers). `None` when the value does not fit the
/// type. For the simulator and tests.
pub fn encode(ty: ValueType, order: Order, length: u16, value: &Value) -> Option<Vec<u16>> {
    if ty == ValueType::String {
        let mut bytes = value.as_str()?.as_bytes().to_vec();
        bytes.resize(usize::from(length) * 2, 0);
        let mut words = Vec::with_capacity(usize::from(length));
        for pair in bytes.chunks(2) {
            let (hi, lo) = (pair[0], pair[1]);
            words.push(if order.swaps_bytes() {
                u16::from_be_bytes([lo, hi])
            } else {
                u16::from_be_bytes([hi, lo])
            });
        }
        return Some(words);
    }
    let bytes: Vec<u8> = match ty {
        ValueType::Bool => return Some(vec![u16::from(value.as_bool()?)]),
        ValueType::U16 => u16::try_from(value.as_u64()?).ok()?.to_be_bytes().to_vec(),
        ValueType::I16 => i16::try_from(value.as_i64()?).ok()?.to_be_bytes().to_vec(),
        ValueType::U32 => u32::try_from(value.as_u64()?).ok()?.to_be_bytes().to_vec(),
        ValueType::I32 => i32::try_from(value.as_i64()?).ok()?.to_be_bytes().to_vec(),
        ValueType::U64 => value.as_u64()?.to_be_bytes().to_vec(),
        ValueType::I64 => value.as_i64()?.to_be_bytes().to_vec(),
        #[allow(clippy::cast_possible_truncation)] // f32 registers hold f32
        ValueType::F32 => (value.as_f64()? as f32).to_be_bytes().to_vec(),
        ValueType::F64 => value.as_f64()?.to_be_bytes().to_vec(),
        ValueType::String => return None,
    };
    Some(registers_of(&bytes, order))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    const ORDERS: [Order; 4] = [Order::Abcd, Order::Dcba, Order::Badc, Order::Cdab];

    /// Known register images of 0x11223344 and of 123.456f32 (0x42F6E979)
    /// as devices documented in each order send them.
    #[test]
    fn every_order_against_known_register_images() {
        let cases: [(Order, [u16; 2], [u16; 2]); 4] = [
            (Order::Abcd, [0x1122, 0x3344], [0x42F6, 0xE979]),
            (Order::Dcba, [0x4433, 0x2211], [0x79E9, 0xF642]),
            (Order::Badc, [0x2211, 0x4433], [0xF642, 0x79E9]),
            (Order::Cdab, [0x3344, 0x1122], [0xE979, 0x42F6]),
        ];
        for (order, int_words, float_words) in cases {
            assert_eq!(decode(ValueType::U32, order, 0, &int_words), Ok(json!(0x1122_3344)));
            let f = decode(ValueType::F32, order, 0, &float_words).unwrap().as_f64().unwrap();
            assert!((f - 123.456).abs() < 1e-4, "{order:?}: {f}");
        }
        // 16 bits: only the byte swap matters.
        assert_eq!(decode(ValueType::U16, Order::Abcd, 0, &[0x1234]), Ok(json!(0x1234)));
        assert_eq!(decode(ValueType::U16, Order::Cdab, 0, &[0x1234]), Ok(json!(0x1234)));
        assert_eq!(decode(ValueType::U16, Order::Badc, 0, &[0x1234]), Ok(json!(0x3412)));
        assert_eq!(decode(ValueType::I16, Order::Abcd, 0, &[0xFFFE]), Ok(json!(-2)));
        // 64 bits: 0x0102030405060708.
        let words = [0x0102, 0x0304, 0x0506, 0x0708];
        assert_eq!(
            decode(ValueType::U64, Order::Abcd, 0, &words),
            Ok(json!(0x0102030405060708u64))
        );
        let dcba = [0x0807, 0x0605, 0x0403, 0x0201];
        assert_eq!(decode(ValueType::U64, Order::Dcba, 0, &dcba), Ok(json!(0x0102030405060708u64)));
        let cdab = [0x0708, 0x0506, 0x0304, 0x0102];
        assert_eq!(decode(ValueType::U64, Order::Cdab, 0, &cdab), Ok(json!(0x0102030405060708u64)));
        assert_eq!(decode(ValueType::I32, Order::Abcd, 0, &[0xFFFF, 0xFFFF]), Ok(json!(-1)));
        assert_eq!(
            decode(ValueType::F64, Order::Abcd, 0, &[0x4009, 0x21FB, 0x5444, 0x2D18]),
            Ok(json!(std::f64::consts::PI))
        );
    }

    #[test]
    fn strings_bools_and_bad_replies() {
        let words = [0x4142, 0x4300, 0x0000]; // "ABC"
        assert_eq!(decode(ValueType::String, Order::Abcd, 3, &words), Ok(json!("ABC")));
        let swapped = [0x4241, 0x0043, 0x0000];
        assert_eq!(decode(ValueType::String, Order::Badc, 3, &swapped), Ok(json!("ABC")));
        assert_eq!(
            decode(ValueType::String, Order::Abcd, 1, &[0xFFFE]),
            Ok(json!("\u{fffd}\u{fffd}"))
        );
        assert_eq!(decode(ValueType::Bool, Order::Abcd, 0, &[7]), Ok(json!(true)));
        assert_eq!(
            decode(ValueType::U32, Order::Abcd, 0, &[1]),
            Err(DecodeError::Short { want: 2, got: 1 })
        );
        assert_eq!(
            decode(ValueType::F32, Order::Abcd, 0, &[0x7FC0, 0]),
            Err(DecodeError::NotFinite)
        );
        assert_eq!(
            decode(ValueType::F32, Order::Abcd, 0, &[0x7F80, 0]),
            Err(DecodeError::NotFinite)
        );
    }

    #[test]
    fn scale_and_offset_apply_to_numbers_only() {
        assert_eq!(scale(json!(215), 0.1, -1.5).unwrap().as_f64().unwrap(), 20.0);
        assert_eq!(scale(json!(7), 1.0, 0.0), Ok(json!(7)));
        assert_eq!(scale(json!("x"), 2.0, 0.0), Ok(json!("x")));
        assert_eq!(scale(json!(f64::MAX), 10.0, 0.0), Err(DecodeError::NotFinite));
    }

    fn roundtrip(ty: ValueType, value: Value) {
        for order in ORDERS {
            let words = encode(ty, order, 8, &value).unwrap();
            assert_eq!(words.len(), usize::from(ty.registers(8)));
            assert_eq!(decode(ty, order, 8, &words), Ok(value.clone()), "{ty:?} {order:?}");
        }
    }

    proptest! {
        #[test]
        fn every_type_roundtrips_in_every_order(
            a in any::<u16>(), b in any::<i16>(), c in any::<u32>(), d in any::<i32>(),
            e in any::<u64>(), f in any::<i64>(), g in -1e30f32..1e30, h in -1e300f64..1e300,
            s in "[ -~]{0,16}",
        ) {
            roundtrip(ValueType::U16, json!(a));
            roundtrip(ValueType::I16, json!(b));
            roundtrip(ValueType::U32, json!(c));
            roundtrip(ValueType::I32, json!(d));
            roundtrip(ValueType::U64, json!(e));
            roundtrip(ValueType::I64, json!(f));
            roundtrip(ValueType::F32, json!(f64::from(g)));
            roundtrip(ValueType::F64, json!(h));
            roundtrip(ValueType::String, json!(s.trim_end_matches(' ')));
        }

        #[test]
        fn any_registers_decode_without_panicking(words in proptest::collection::vec(any::<u16>(), 0..6), length in 0u16..6) {
            for order in ORDERS {
                for ty in [ValueType::Bool, ValueType::U16, ValueType::I16, ValueType::U32, ValueType::I32, ValueType::U64, ValueType::I64, ValueType::F32, ValueType::F64, ValueType::String] {
                    let _ = decode(ty, order, length, &words);
                }
            }
        }
    }
}
