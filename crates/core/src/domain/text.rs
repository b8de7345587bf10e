//! What PostgreSQL can store of producers' text and JSON, checked once at the edge.
//!
//! PostgreSQL's `text` and `jsonb` cannot hold U+0000 (`\u0000` in JSON): the insert
//! fails with an encoding error, which used to reach clients as `500 INTERNAL`. Every
//! string from outside (bodies, query strings, paths, GraphQL arguments and variables)
//! passes through [`refuse_nul`] or [`check_json`] before anything is read or written,
//! so it is refused with one code, `TEXT-NUL`, wherever it comes in.

use serde_json::Value;

use crate::error::{ErrorCode, Rejection};

/// Longest piece of a client's input quoted back in an error message: enough to
/// recognise it, never the whole of a large value.
pub const MAX_ECHO: usize = 64;

/// `s`, cut to [`MAX_ECHO`] characters (with `…`) for quoting in an error message.
pub fn echo(s: &str) -> String {
    match s.char_indices().nth(MAX_ECHO) {
        Some((at, _)) => format!("{}… ({} bytes)", &s[..at], s.len()),
        None => s.to_owned(),
    }
}

/// The rejection for a NUL character at `place` (a field name or a JSON path).
pub fn nul_rejection(place: &str) -> Rejection {
    Rejection::new(
        ErrorCode::TextNul,
        format!(
            "{} holds the NUL character (U+0000, `\\u0000`), which PostgreSQL cannot store; \
             remove it or encode it",
            echo(place)
        ),
    )
}

/// Refuses a string that holds U+0000; `place` names it in the message.
pub fn refuse_nul(place: &str, s: &str) -> Result<(), Rejection> {
    if s.contains('\0') {
        return Err(nul_rejection(place));
    }
    Ok(())
}

/// Readies a JSON value from outside for storage in `jsonb`: refuses U+0000 in any
/// string or object key ([`ErrorCode::TextNul`]) and every number `jsonb` cannot hold
/// exactly ([`ErrorCode::NumberUnstorable`]), and writes the others as PostgreSQL will
/// give them back ([`canonical_number`]), so what a producer's event holds in memory
/// is what every reader gets from the database. The message gives the path
/// (`root.a[2].b`) of the first offender.
pub fn check_json(root: &str, v: &mut Value) -> Result<(), Rejection> {
    let mut path = vec![];
    match walk(v, &mut path) {
        Ok(()) => Ok(()),
        Err(make) => {
            let mut place = root.to_owned();
            for seg in path.iter().rev() {
                place.push_str(seg);
            }
            Err(make(&place))
        }
    }
}

type Refusal = Box<dyn FnOnce(&str) -> Rejection>;

/// Fills `path` (innermost segment first) on the way out of an error.
fn walk(v: &mut Value, path: &mut Vec<String>) -> Result<(), Refusal> {
    match v {
        Value::String(s) if s.contains('\0') => Err(Box::new(|p: &str| nul_rejection(p))),
        Value::Number(n) => match canonical_number(n.as_str()) {
            Ok(None) => Ok(()),
            Ok(Some(canon)) => {
                // The canonical text is a valid JSON number by construction.
                if let Ok(c) = serde_json::from_str::<serde_json::Number>(&canon) {
                    *n = c;
                }
                Ok(())
            }
            Err(why) => {
                let shown = echo(n.as_str());
                Err(Box::new(move |p: &str| {
                    Rejection::new(
                        ErrorCode::NumberUnstorable,
                        format!("{} is the number {shown}, which cannot be stored exactly: {why}", echo(p)),
                    )
                }))
            }
        },
        Value::Array(items) => {
            for (i, x) in items.iter_mut().enumerate() {
                walk(x, path).inspect_err(|_| path.push(format!("[{i}]")))?;
            }
            Ok(())
        }
        Value::Object(map) => {
            if let Some(k) = map.keys().find(|k| k.contains('\0')) {
                path.push(format!(".{}", k.replace('\0', "\\u0000")));
                return Err(Box::new(|p: &str| nul_rejection(p)));
            }
            for (k, x) in map.iter_mut() {
                walk(x, path).inspect_err(|_| path.push(format!(".{k}")))?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Most digits `numeric` keeps before the decimal point, and after it.
const MAX_INTEGER_DIGITS: usize = 131_072;
const MAX_SCALE: usize = 16_383;

/// A JSON number as PostgreSQL's `jsonb` stores and returns it (`numeric`, exact):
/// `Ok(None)` when the text already is that, `Ok(Some(text))` when `jsonb` would write it
/// another way (`1e2` is `100`, `1.5E-3` is `0.0015`, `1.50e1` is `15.0`: the same
/// value, with as many decimals as the text implies), and `Err` when `jsonb` cannot hold
/// the value exactly: a negative zero (`numeric` has no sign for 0), or beyond
/// `numeric`'s 131,072 digits before the point or 16,383 after it.
pub fn canonical_number(text: &str) -> Result<Option<String>, &'static str> {
    let (neg, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exp) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], Some(&unsigned[at + 1..])),
        None => (unsigned, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = || int.bytes().chain(frac.bytes());
    let zero = digits().all(|b| b == b'0');
    if neg && zero {
        return Err("PostgreSQL stores a negative zero as 0; send 0");
    }
    let Some(exp) = exp else {
        // Plain text is already in numeric's form; only its size can be out of range.
        if frac.len() > MAX_SCALE {
            return Err("numeric keeps at most 16,383 digits after the decimal point");
        }
        if int.trim_start_matches('0').len() > MAX_INTEGER_DIGITS {
            return Err("numeric keeps at most 131,072 digits before the decimal point");
        }
        return Ok(None);
    };
    // A longer exponent is far out of range either way (or zero, checked below).
    let exp: i64 = exp.parse().unwrap_or(if exp.starts_with('-') { i64::MIN / 2 } else { i64::MAX / 2 });
    let all: String = digits().map(char::from).collect();
    let scale = (frac.len() as i64).saturating_sub(exp).max(0);
    if scale > MAX_SCALE as i64 {
        return Err("numeric keeps at most 16,383 digits after the decimal point");
    }
    if zero {
        return Ok(Some(format!("0{}{}", if scale > 0 { "." } else { "" }, "0".repeat(scale as usize))));
    }
    // The decimal point sits `point` digits into `all` (before it when negative).
    let point = (int.len() as i64).saturating_add(exp);
    let significant = all.trim_start_matches('0');
    let lead = (all.len() - significant.len()) as i64;
    if point - lead > MAX_INTEGER_DIGITS as i64 {
        return Err("numeric keeps at most 131,072 digits before the decimal point");
    }
    let mut out = String::with_capacity(all.len() + 8);
    if neg {
        out.push('-');
    }
    if point <= 0 {
        out.push('0');
    } else {
        let p = point as usize;
        let int_part =
            if p <= all.len() { all[..p].to_owned() } else { format!("{all}{}", "0".repeat(p - all.len())) };
        let int_part = int_part.trim_start_matches('0');
        out.push_str(if int_part.is_empty() { "0" } else { int_part });
    }
    if scale > 0 {
        out.push('.');
        if point < 0 {
            out.push_str(&"0".repeat((-point) as usize));
            out.push_str(&all);
        } else {
            out.push_str(&all[point as usize..]);
        }
    }
    Ok((out != text).then_some(out))
}

/// True when `text` (a JSON number) and `f` are the same value: a float field keeps
/// what it was sent only then.
pub fn same_value(text: &str, f: f64) -> bool {
    f.is_finite() && decimal(text) == decimal(&format!("{f:e}"))
}

/// A number's value as (negative, significant digits, exponent of the last digit).
fn decimal(text: &str) -> (bool, String, i64) {
    let (neg, rest) = text.strip_prefix('-').map_or((false, text), |r| (true, r));
    let (mantissa, exp) = rest.split_once(['e', 'E']).unwrap_or((rest, "0"));
    let exp: i64 = exp.parse().unwrap_or(0);
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{int}{frac}");
    let trimmed = all.trim_start_matches('0').trim_end_matches('0');
    if trimmed.is_empty() {
        return (false, String::new(), 0);
    }
    let trailing = (all.len() - all.trim_end_matches('0').len()) as i64;
    (neg, trimmed.to_owned(), exp - frac.len() as i64 + trailing)
}

/// True when a percent-encoded URI component (path or query) decodes to a NUL byte.
/// `%00` is the only way to put one in a URI: hyper refuses raw control bytes.
pub fn uri_has_nul(raw: &str) -> bool {
    raw.contains("%00")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_is_found_in_strings_and_keys_with_its_path() {
        assert!(check_json("payload", &mut json!({"a": ["x", {"b": "ok"}]})).is_ok());
        let r = check_json("payload", &mut json!({"a": ["x", {"b": "o\u{0}k"}]})).unwrap_err();
        assert_eq!(r.code, ErrorCode::TextNul);
        assert!(r.message.starts_with("payload.a[1].b holds"), "{}", r.message);
        let r = check_json("payload", &mut json!({"k\u{0}": 1})).unwrap_err();
        assert!(r.message.contains("payload.k\\u0000"), "{}", r.message);
        assert!(refuse_nul("`reason`", "a\u{0}").is_err());
        assert!(uri_has_nul("/v1/keys/%00") && !uri_has_nul("/v1/keys/%2500"));
    }

    #[test]
    fn numbers_are_written_as_numeric_writes_them_or_refused() {
        // (sent, what PostgreSQL's jsonb returns), checked against PostgreSQL 15.
        for (sent, stored) in [
            ("0", "0"),
            ("123456789012345678901234567890", "123456789012345678901234567890"),
            ("-17", "-17"),
            ("1.50", "1.50"),
            ("0.000", "0.000"),
            ("1e2", "100"),
            ("1E+2", "100"),
            ("1.5e1", "15"),
            ("1.50e1", "15.0"),
            ("120e-1", "12.0"),
            ("-1e-3", "-0.001"),
            ("1.5E-3", "0.0015"),
            ("0e200000", "0"),
            ("0.0e3", "0"),
            ("0e-2", "0.00"),
            ("12.5e-1", "1.25"),
            ("0.012e2", "1.2"),
            ("0.0012e1", "0.012"),
        ] {
            let got = canonical_number(sent).unwrap_or_else(|e| panic!("{sent}: {e}"));
            assert_eq!(got.as_deref().unwrap_or(sent), stored, "{sent}");
        }
        let tiny = canonical_number("1e-400").unwrap().unwrap();
        assert_eq!(tiny.len(), 402, "0. and 399 zeros and 1");
        assert!(tiny.starts_with("0.000") && tiny.ends_with("01"));
        assert_eq!(canonical_number("1e131071").unwrap().unwrap().len(), 131_072);
        for bad in [
            "-0",
            "-0.0",
            "-0e5",
            "1e131072",
            "1.5e-16383",
            "10e-16384",
            "0e-200000",
            "1e99999999999999999999",
        ] {
            assert!(canonical_number(bad).is_err(), "{bad}");
        }
        let mut v = json!({"a": [1, 2.50, 1e2]});
        check_json("payload", &mut v).unwrap();
        assert_eq!(
            v.to_string(),
            r#"{"a":[1,2.5,100.0]}"#,
            "json! writes floats its own way; 1e2 as a float is 100.0"
        );
        let mut v: Value = serde_json::from_str(r#"{"a": [1e2, -0]}"#).unwrap();
        let r = check_json("payload", &mut v).unwrap_err();
        assert_eq!(r.code, ErrorCode::NumberUnstorable);
        assert!(r.message.starts_with("payload.a[1] is the number -0"), "{}", r.message);
    }

    #[test]
    fn a_float_field_is_exact_only_when_its_text_is_its_value() {
        assert!(same_value("0.1", 0.1) && same_value("1.50", 1.5) && same_value("1e2", 100.0));
        assert!(same_value("0.30000000000000004", 0.1 + 0.2));
        assert!(!same_value("0.3000000000000000444", 0.30000000000000004));
        assert!(!same_value("123456789012345678901234567890", 1.2345678901234568e29));
        assert!(!same_value("1e-400", 0.0));
    }

    #[test]
    fn echoes_are_capped() {
        let long = "x".repeat(900_000);
        let e = echo(&long);
        assert!(e.len() < 100 && e.ends_with("(900000 bytes)"), "{e}");
        assert_eq!(echo("short"), "short");
    }
}
