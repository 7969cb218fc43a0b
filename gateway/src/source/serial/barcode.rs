//! Barcode scanner lines: the AIM symbology identifier a scanner may put in
//! front (`]C1`, `]d2`, `]Q3`, ...), and GS1 element strings parsed into
//! application identifiers with their check digits verified. I/O-free.
//!
//! A code is read as GS1 when its identifier says so (`]C1` GS1-128, `]d2`
//! GS1 DataMatrix, `]Q3` GS1 QR, `]e0` GS1 DataBar) or, without one, when
//! it holds a GS (0x1D) separator; anything else is a plain code. Variable
//! length fields end at a GS (FNC1) or at the end of the code.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value, json};

/// GS, the FNC1 separator as scanners transmit it.
const GS: char = '\u{1d}';

/// A scanned code, ready to become a `barcode.scanned` event.
#[derive(Debug, Clone, PartialEq)]
pub struct Scan {
    /// The code without its symbology identifier.
    pub data: String,
    /// `]C1` and friends, when the scanner sent one.
    pub aim: Option<String>,
    /// Application identifiers, when the code is GS1.
    pub ais: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ScanError {
    Empty,
    /// Not printable text (garbage on the line).
    NotText,
    UnknownAi(String),
    /// A fixed-length field is cut short, or a variable one is too long.
    BadLength(String),
    /// A field that must be digits is not.
    NotDigits(String),
    BadCheckDigit(String),
    BadDate(String),
}

impl ScanError {
    /// The rejection reason counted in health.
    pub fn reason(&self) -> &'static str {
        match self {
            ScanError::Empty => "empty",
            ScanError::NotText => "not_text",
            ScanError::BadCheckDigit(_) => "bad_check_digit",
            _ => "bad_gs1",
        }
    }
}

impl fmt::Display for ScanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanError::Empty => f.write_str("empty line"),
            ScanError::NotText => f.write_str("not printable text"),
            ScanError::UnknownAi(at) => write!(f, "unknown GS1 application identifier at {at:?}"),
            ScanError::BadLength(ai) => write!(f, "GS1 AI ({ai}) has the wrong length"),
            ScanError::NotDigits(ai) => write!(f, "GS1 AI ({ai}) must be digits"),
            ScanError::BadCheckDigit(ai) => write!(f, "GS1 AI ({ai}) fails its check digit"),
            ScanError::BadDate(ai) => write!(f, "GS1 AI ({ai}) is not a YYMMDD date"),
        }
    }
}

/// How an application identifier's field is shaped.
#[derive(Clone, Copy)]
enum Field {
    /// Exactly n digits, the last a GS1 check digit.
    Checked(usize),
    /// Exactly n digits.
    Digits(usize),
    /// A YYMMDD date (DD may be 00: end of month).
    Date,
    /// Up to n characters, ended by GS or the end.
    Text(usize),
    /// Up to n digits, ended by GS or the end.
    Count(usize),
}

/// The supported AIs: (identifier, field, property name).
const AIS: &[(&str, Field, &str)] = &[
    ("00", Field::Checked(18), "sscc"),
    ("01", Field::Checked(14), "gtin"),
    ("02", Field::Checked(14), "contentGtin"),
    ("10", Field::Text(20), "batch"),
    ("11", Field::Date, "productionDate"),
    ("13", Field::Date, "packagingDate"),
    ("15", Field::Date, "bestBefore"),
    ("17", Field::Date, "expiry"),
    ("21", Field::Text(20), "serial"),
    ("30", Field::Count(8), "count"),
    ("37", Field::Count(8), "units"),
    ("400", Field::Text(30), "orderNumber"),
    ("410", Field::Checked(13), "shipTo"),
    ("414", Field::Checked(13), "location"),
];

/// Net weight in kg, `310n`: six digits with n decimals.
const NET_WEIGHT: &str = "310";

/// Whether an AIM identifier announces GS1 data.
fn aim_is_gs1(aim: &str) -> bool {
    matches!(aim, "]C1" | "]d2" | "]Q3" | "]e0" | "]J1")
}

/// Parses one scanner line (without its CR/LF).
pub fn parse(line: &str) -> Result<Scan, ScanError> {
    if line.chars().any(|c| c.is_control() && c != GS) {
        return Err(ScanError::NotText);
    }
    let (aim, data) = match line.strip_prefix(']') {
        Some(rest) if rest.len() >= 2 && rest.is_char_boundary(2) => {
            (Some(line[..3].to_owned()), &line[3..])
        }
        _ => (None, line),
    };
    if data.is_empty() {
        return Err(ScanError::Empty);
    }
    let gs1 = aim.as_deref().map_or(data.contains(GS), aim_is_gs1);
    let ais = if gs1 { Some(parse_gs1(data)?) } else { None };
    let data = data.replace(GS, "");
    Ok(Scan { data, aim, ais })
}

/// Splits a GS1 element string into its AIs.
pub fn parse_gs1(data: &str) -> Result<BTreeMap<String, String>, ScanError> {
    let mut out = BTreeMap::new();
    let mut rest = data.trim_start_matches(GS);
    while !rest.is_empty() {
        let (ai, field) = identify(rest)?;
        rest = &rest[ai.len()..];
        let (value, after) = match field {
            Field::Checked(n) | Field::Digits(n) => {
                let value = rest.get(..n).ok_or_else(|| ScanError::BadLength(ai.clone()))?;
                (value, &rest[n..])
            }
            Field::Date => {
                let value = rest.get(..6).ok_or_else(|| ScanError::BadLength(ai.clone()))?;
                (value, &rest[6..])
            }
            Field::Text(max) | Field::Count(max) => {
                let end = rest.find(GS).unwrap_or(rest.len());
                if end == 0 || end > max {
                    return Err(ScanError::BadLength(ai));
                }
                (&rest[..end], &rest[end..])
            }
        };
        match field {
            Field::Checked(_) | Field::Digits(_) | Field::Date | Field::Count(_)
                if !value.bytes().all(|b| b.is_ascii_digit()) =>
            {
                return Err(ScanError::NotDigits(ai));
            }
            Field::Checked(_) if !check_digit_ok(value) => {
                return Err(ScanError::BadCheckDigit(ai));
            }
            Field::Date if !date_ok(value) => return Err(ScanError::BadDate(ai)),
            _ => {}
        }
        out.insert(ai, value.to_owned());
        rest = after.trim_start_matches(GS);
    }
    Ok(out)
}

/// The AI at the start of `rest` and its field shape.
fn identify(rest: &str) -> Result<(String, Field), ScanError> {
    if let Some(n) = rest.strip_prefix(NET_WEIGHT).and_then(|r| r.chars().next())
        && n.is_ascii_digit()
    {
        return Ok((format!("{NET_WEIGHT}{n}"), Field::Digits(6)));
    }
    AIS.iter()
        .filter(|(ai, ..)| rest.starts_with(ai))
        .max_by_key(|(ai, ..)| ai.len())
        .map(|(ai, field, _)| ((*ai).to_owned(), *field))
        .ok_or_else(|| ScanError::UnknownAi(rest.chars().take(4).collect()))
}

/// Whether the last digit of `digits` is the GS1 check digit of the rest.
pub fn check_digit_ok(digits: &str) -> bool {
    match digits.len().checked_sub(1).and_then(|n| digits.get(..n).zip(digits.get(n..))) {
        Some((body, check)) => check_digit(body).is_some_and(|d| check == d.to_string()),
        None => false,
    }
}

/// The GS1 mod-10 check digit of `body` (weights 3 and 1 from the right);
/// `None` unless `body` is all digits.
pub fn check_digit(body: &str) -> Option<u32> {
    if !body.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let sum: u32 = body
        .bytes()
        .rev()
        .enumerate()
        .map(|(i, b)| u32::from(b - b'0') * if i % 2 == 0 { 3 } else { 1 })
        .sum();
    Some((10 - sum % 10) % 10)
}

/// A real date, or day 00 (the month's last day); the year as
/// [`iso_date`] reads it.
fn date_ok(yymmdd: &str) -> bool {
    let n = |r: std::ops::Range<usize>| yymmdd.get(r).and_then(|s| s.parse::<i64>().ok());
    match (n(0..2), n(2..4), n(4..6)) {
        (Some(yy), Some(month @ 1..=12), Some(day)) => {
            (0..=opgraph_proto::datetime::days_in_month(2000 + yy, month)).contains(&day)
        }
        _ => false,
    }
}

/// `YYMMDD` as `20YY-MM-DD` (GS1's century rule simplified to 2000-2099;
/// `DD` 00 means the last day of the month and is kept as `00`).
fn iso_date(yymmdd: &str) -> String {
    format!("20{}-{}-{}", &yymmdd[0..2], &yymmdd[2..4], &yymmdd[4..6])
}

impl Scan {
    /// The trackable code events carry: the SSCC, else the GTIN (with its
    /// serial when there is one, as `gtin.serial`), else the data.
    pub fn trackable_code(&self) -> String {
        let Some(ais) = &self.ais else { return self.data.clone() };
        if let Some(sscc) = ais.get("00") {
            return sscc.clone();
        }
        match (ais.get("01"), ais.get("21")) {
            (Some(gtin), Some(serial)) => format!("{gtin}.{serial}"),
            (Some(gtin), None) => gtin.clone(),
            _ => self.data.clone(),
        }
    }

    /// The event's properties: `data`, `symbology`, and for GS1 codes the
    /// raw `ais` plus named fields (`gtin`, `sscc`, `batch`, `expiry` as a
    /// date, `serial`, `netWeightKg`, ...).
    pub fn properties(&self) -> Value {
        let mut props = Map::new();
        props.insert("data".into(), json!(self.data));
        if let Some(aim) = &self.aim {
            props.insert("symbology".into(), json!(aim));
        }
        if let Some(ais) = &self.ais {
            props.insert("gs1".into(), json!(true));
            props.insert("ais".into(), json!(ais));
            for (ai, value) in ais {
                if let Some(decimals) = ai.strip_prefix(NET_WEIGHT) {
                    let d: i32 = decimals.parse().unwrap_or(0);
                    let raw: f64 = value.parse().unwrap_or(0.0);
                    props.insert("netWeightKg".into(), json!(raw / 10f64.powi(d)));
                    continue;
                }
                let Some((_, field, name)) = AIS.iter().find(|(a, ..)| a == ai) else { continue };
                let shown = match field {
                    Field::Date => json!(iso_date(value)),
                    Field::Count(_) => json!(value.parse::<u64>().unwrap_or(0)),
                    _ => json!(value),
                };
                props.insert((*name).into(), shown);
            }
        }
        Value::Object(props)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn gs1_128_with_fnc1_separators() {
        let line = "]C1010950600013435217261231\u{1d}10ABC123\u{1d}21S-9";
        let scan = parse(line).unwrap();
        assert_eq!(scan.aim.as_deref(), Some("]C1"));
        let ais = scan.ais.clone().unwrap();
        assert_eq!(ais["01"], "09506000134352");
        assert_eq!(ais["17"], "261231");
        assert_eq!(ais["10"], "ABC123");
        assert_eq!(ais["21"], "S-9");
        assert_eq!(scan.trackable_code(), "09506000134352.S-9");
        let props = scan.properties();
        assert_eq!(props["gtin"], "09506000134352");
        assert_eq!(props["expiry"], "2026-12-31");
        assert_eq!(props["batch"], "ABC123");
        assert_eq!(props["symbology"], "]C1");
    }

    #[test]
    fn sscc_weight_and_counts() {
        let scan = parse("]d2003761234567890123493103001250\u{1d}3012").unwrap();
        assert_eq!(scan.trackable_code(), "376123456789012349");
        let props = scan.properties();
        assert_eq!(props["sscc"], "376123456789012349");
        assert_eq!(props["netWeightKg"], 1.25);
        assert_eq!(props["count"], 12);
    }

    #[test]
    fn plain_codes_and_non_gs1_symbologies() {
        let scan = parse("]E04006381333931").unwrap(); // EAN-13, not GS1 element string
        assert_eq!(scan.ais, None);
        assert_eq!(scan.data, "4006381333931");
        assert_eq!(scan.trackable_code(), "4006381333931");
        let plain = parse("PALLET-0042").unwrap();
        assert_eq!((plain.aim, plain.ais), (None, None));
    }

    #[test]
    fn bad_codes_are_refused_with_a_reason() {
        let bad_check = parse("]C10109506000134353").unwrap_err();
        assert_eq!(bad_check, ScanError::BadCheckDigit("01".into()));
        assert_eq!(bad_check.reason(), "bad_check_digit");
        assert_eq!(parse("]C199123").unwrap_err().reason(), "bad_gs1");
        assert_eq!(parse("]C1010950600013").unwrap_err(), ScanError::BadLength("01".into()));
        assert_eq!(parse("]C117261331").unwrap_err(), ScanError::BadDate("17".into()));
        assert_eq!(parse("]C117260231").unwrap_err(), ScanError::BadDate("17".into()));
        assert_eq!(parse("]C117250229").unwrap_err(), ScanError::BadDate("17".into()));
        assert!(parse("]C117280229").is_ok(), "a leap day");
        assert!(parse("]C117260200").is_ok(), "day 00: the month's last");
        assert_eq!(parse("]C1").unwrap_err(), ScanError::Empty);
        assert_eq!(parse("ab\u{7}cd").unwrap_err(), ScanError::NotText);
        assert!(parse("]C110").is_err(), "an empty variable field");
        assert!(parse("]C110ABCDEFGHIJKLMNOPQRSTU").is_err(), "21 characters of batch");
    }

    #[test]
    fn check_digits_of_published_examples() {
        for good in ["09506000134352", "376123456789012349", "4006381333931", "96385074"] {
            assert!(check_digit_ok(good), "{good}");
        }
        assert!(!check_digit_ok("09506000134353"));
    }

    /// `body` with its check digit appended.
    fn with_check(body: &str) -> String {
        format!("{body}{}", check_digit(body).unwrap())
    }

    proptest! {
        #[test]
        fn generated_element_strings_roundtrip(
            gtin in "[0-9]{13}", batch in "[A-Z0-9]{1,20}", serial in "[A-Za-z0-9-]{1,20}",
            yy in 0u32..100, mm in 1u32..13, dd in 0u32..29,
        ) {
            let gtin = with_check(&gtin);
            let date = format!("{yy:02}{mm:02}{dd:02}");
            let line = format!("]C101{gtin}17{date}10{batch}\u{1d}21{serial}");
            let ais = parse(&line).unwrap().ais.unwrap();
            prop_assert_eq!(&ais["01"], &gtin);
            prop_assert_eq!(&ais["17"], &date);
            prop_assert_eq!(&ais["10"], &batch);
            prop_assert_eq!(&ais["21"], &serial);
        }

        #[test]
        fn any_line_parses_or_is_refused_without_panicking(line in "\\PC{0,40}", bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = parse(&line);
            let _ = parse(&format!("]C1{line}"));
            let _ = parse(&String::from_utf8_lossy(&bytes));
        }

        #[test]
        fn a_changed_digit_fails_the_check(body in "[0-9]{13}", at in 0usize..14, delta in 1u8..10) {
            let good = with_check(&body);
            let mut bytes = good.into_bytes();
            bytes[at] = b'0' + (bytes[at] - b'0' + delta) % 10;
            prop_assert!(!check_digit_ok(std::str::from_utf8(&bytes).unwrap()));
        }
    }
}
