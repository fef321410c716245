//! The ECMAScript form of a number ([`es_number`]), as RFC 8785 writes every float in a key's
//! canonical JSON.

/// ECMAScript's `Number.prototype.toString` of a finite double (ECMA-262 §6.1.6.1.20), the form
/// RFC 8785 §3.2.2.3 prescribes.
///
/// ```
/// use stormguard::key::es_number;
/// // RFC 8785, appendix B.
/// assert_eq!(es_number(1e21), "1e+21");
/// assert_eq!(es_number(333333333.3333333), "333333333.3333333");
/// assert_eq!(es_number(5e-324), "5e-324");
/// assert_eq!(es_number(1.7976931348623157e308), "1.7976931348623157e+308");
/// assert_eq!(es_number(9007199254740994.0), "9007199254740994");
/// assert_eq!(es_number(0.01 * 1.19), "0.011899999999999999"); // the double it is, exactly
/// // Exactly 1424953923781206.25: two shortest forms, equally near; the even one is taken.
/// assert_eq!(es_number(f64::from_bits(0x43143ff3c1cb0959)), "1424953923781206.2");
/// ```
pub fn es_number(f: f64) -> String {
    if f == 0.0 {
        return "0".to_string();
    }
    if f < 0.0 {
        return format!("-{}", es_number(-f));
    }
    let (digits, n) = shortest_digits(f);
    let k = digits.len() as i32;
    if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let sign = if e < 0 { '-' } else { '+' };
        match digits.split_at(1) {
            (first, "") => format!("{first}e{sign}{}", e.abs()),
            (first, rest) => format!("{first}.{rest}e{sign}{}", e.abs()),
        }
    }
}

/// The digits `s` (no trailing zeros) and the exponent `n` with `f = 0.s * 10^n`, for a
/// finite `f > 0`, as ECMA-262 Number::toString step 5 chooses them: as few digits as read back
/// as `f`; of those, the digits nearest `f`; of two equally near, the even ones.
///
/// Rust's `{:e}` gives the fewest digits, but at an exact tie it does not take the even ones
/// (`1424953923781206.25` comes out as `...206.3`; RFC 8785 appendix B says `...206.2`).
/// Rust's fixed-precision `{:.*e}` rounds the exact value, ties to even: with the shortest
/// form's digit count it gives the spec's digits whenever they read back as `f`. They may not
/// only at a power of two, where the gap below `f` is half the gap above; the spec then takes
/// the nearest digits that do read back, which are the shortest form's.
/// `tests/canonical_numbers.rs` checks both against a slow model of the spec.
fn shortest_digits(f: f64) -> (String, i32) {
    let split = |sci: String| {
        let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
        let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
        let digits = digits.trim_end_matches('0').to_string();
        (digits, exp.parse::<i32>().unwrap_or(0) + 1)
    };
    // The shortest digits that read back as `f`: "d.ddde±x".
    let (shortest, n) = split(format!("{f:e}"));
    let precision = shortest.len().saturating_sub(1);
    let rounded = format!("{f:.precision$e}");
    if rounded.parse::<f64>() == Ok(f) {
        split(rounded)
    } else {
        (shortest, n)
    }
}
