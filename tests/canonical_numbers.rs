//! The number form of a key's canonical JSON (RFC 8785 §3.2.2.3, ECMAScript's
//! `Number.prototype.toString`), checked against the RFC's own vectors and a slow reference model.

use proptest::prelude::*;
use stormguard::key::es_number;

/// RFC 8785, appendix B: IEEE-754 bits and the JSON text every conforming implementation writes.
const APPENDIX_B: &[(u64, &str)] = &[
    (0x0000000000000000, "0"),
    (0x8000000000000000, "0"),
    (0x0000000000000001, "5e-324"),
    (0x8000000000000001, "-5e-324"),
    (0x7fefffffffffffff, "1.7976931348623157e+308"),
    (0xffefffffffffffff, "-1.7976931348623157e+308"),
    (0x4340000000000000, "9007199254740992"),
    (0xc340000000000000, "-9007199254740992"),
    (0x4430000000000000, "295147905179352830000"),
    (0x44b52d02c7e14af5, "9.999999999999997e+22"),
    (0x44b52d02c7e14af6, "1e+23"),
    (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
    (0x444b1ae4d6e2ef4e, "999999999999999700000"),
    (0x444b1ae4d6e2ef4f, "999999999999999900000"),
    (0x444b1ae4d6e2ef50, "1e+21"),
    (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
    (0x3eb0c6f7a0b5ed8d, "0.000001"),
    (0x41b3de4355555553, "333333333.3333332"),
    (0x41b3de4355555554, "333333333.33333325"),
    (0x41b3de4355555555, "333333333.3333333"),
    (0x41b3de4355555556, "333333333.3333334"),
    (0x41b3de4355555557, "333333333.33333343"),
    (0xbecbf647612f3696, "-0.0000033333333333333333"),
    // Exactly 1424953923781206.25: two 17-digit forms are equally near; the even one wins.
    (0x43143ff3c1cb0959, "1424953923781206.2"),
    // Not in the table, named in the report.
    (0x4340000000000001, "9007199254740994"),
    (0x4340000000000002, "9007199254740996"),
];

#[test]
fn rfc_8785_appendix_b_numbers() {
    let wrong: Vec<String> = APPENDIX_B
        .iter()
        .filter_map(|&(bits, want)| {
            let got = es_number(f64::from_bits(bits));
            (got != want).then(|| format!("{bits:#018x}: got {got}, want {want}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn exact_ties_take_the_even_digit() {
    // Every double in [2^50, 2^51) that ends in .25 or .75 lies exactly halfway between two
    // shortest (17-digit) forms.
    let two_50 = (1u64 << 50) as f64; // 1125899906842624, exactly
    assert_eq!(es_number(two_50 + 0.25), "1125899906842624.2");
    assert_eq!(es_number(two_50 + 0.75), "1125899906842624.8");
    assert_eq!(es_number(two_50 + 1.25), "1125899906842625.2");
    assert_eq!(es_number(-(two_50 + 1.75)), "-1125899906842625.8");
}

/// The digits of `x > 0`'s exact decimal expansion (every double has one, at most 767
/// significant digits) and the power of ten of the first: `x = 0.d1d2d3... * 10^n`.
fn exact_digits(x: f64) -> (Vec<u8>, i32) {
    let text = format!("{x:.800e}");
    let (mantissa, exp) = text.split_once('e').unwrap();
    let digits = mantissa
        .bytes()
        .filter(u8::is_ascii_digit)
        .map(|b| b - b'0');
    (digits.collect(), exp.parse::<i32>().unwrap() + 1)
}

/// The slow reference model of ECMA-262 Number::toString's digits, straight from the spec:
/// the smallest k for which some k-digit s * 10^(n-k) reads back as x; among those the one
/// nearest x, and of two equally near, the even one. Only the two k-digit numbers either side
/// of x can be nearest, so they are the candidates. Returns (s's digits, n).
fn reference_digits(x: f64) -> (String, i32) {
    let (exact, n) = exact_digits(x);
    for k in 1..=17usize {
        let below: String = exact[..k].iter().map(|d| char::from(b'0' + d)).collect();
        let rest = &exact[k..];
        let read = |digits: &str, n: i32| -> f64 { format!("0.{digits}e{n}").parse().unwrap() };
        let mut candidates = vec![(below.clone(), n)];
        if rest.iter().any(|&d| d != 0) {
            // The k-digit number above x (a carry out of 99..9 gives 10..0, one place up).
            let up = (below.parse::<u128>().unwrap() + 1).to_string();
            candidates.push(if up.len() > k {
                (up[..k].to_string(), n + 1)
            } else {
                (up, n)
            });
        }
        let fits: Vec<&(String, i32)> = candidates
            .iter()
            .filter(|(d, n)| read(d, *n) == x)
            .collect();
        let pick = match fits.as_slice() {
            [] => continue,
            [one] => *one,
            [lo, hi] => {
                // Compare the rest of the expansion with one half of a unit in the k-th place.
                let half =
                    rest.first().is_some_and(|&d| d == 5) && rest[1..].iter().all(|&d| d == 0);
                let above_half =
                    rest.first().is_some_and(|&d| d > 5) || (rest.first() == Some(&5) && !half);
                if half {
                    if lo.0.ends_with(['0', '2', '4', '6', '8']) {
                        *lo
                    } else {
                        *hi
                    }
                } else if above_half {
                    *hi
                } else {
                    *lo
                }
            }
            _ => unreachable!(),
        };
        return (pick.0.trim_end_matches('0').to_string(), pick.1);
    }
    unreachable!("17 digits always read back")
}

/// The ECMAScript layout (ECMA-262 Number::toString, steps 6 to 10) of digits `s` and `n`.
fn layout(s: &str, n: i32) -> String {
    let k = s.len() as i32;
    if k <= n && n <= 21 {
        format!("{s}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &s[..n as usize], &s[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{s}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let sign = if e < 0 { '-' } else { '+' };
        if k == 1 {
            format!("{s}e{sign}{}", e.abs())
        } else {
            format!("{}.{}e{sign}{}", &s[..1], &s[1..], e.abs())
        }
    }
}

fn reference(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let (s, n) = reference_digits(x.abs());
    let sign = if x < 0.0 { "-" } else { "" };
    format!("{sign}{}", layout(&s, n))
}

/// Doubles whose exact value is a tie between two shortest forms: (2^50 + m) + 0.25 or 0.75.
fn ties() -> impl Strategy<Value = f64> {
    (0u64..(1 << 50), any::<bool>(), any::<bool>()).prop_map(|(m, three, neg)| {
        let x = (1u64 << 50) as f64 + m as f64 + if three { 0.75 } else { 0.25 };
        if neg {
            -x
        } else {
            x
        }
    })
}

fn finite() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<u64>()
            .prop_map(f64::from_bits)
            .prop_filter("finite", |f| f.is_finite()),
        // Short decimals, the numbers arguments hold.
        (any::<i32>(), -12i32..12).prop_map(|(m, e)| format!("{m}e{e}").parse().unwrap()),
        ties(),
        // Powers of two and their neighbours: the gap below is half the gap above.
        (1u64..2047, -2i64..=2)
            .prop_map(|(e, step)| f64::from_bits(((e << 52) as i64 + step) as u64))
            .prop_filter("finite", |f| f.is_finite()),
    ]
}

#[test]
fn the_reference_model_agrees_with_the_rfc() {
    for &(bits, want) in APPENDIX_B {
        assert_eq!(reference(f64::from_bits(bits)), want, "{bits:#018x}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4_000))]

    /// The text reads back as the same double, has as many digits as Rust's shortest form, and
    /// is what the spec's reference model writes (the shortest form's digits, except at an exact
    /// tie, where the even one of the two is taken).
    #[test]
    fn es_number_is_the_spec(x in finite()) {
        let text = es_number(x);
        prop_assert_eq!(text.parse::<f64>().unwrap(), if x == 0.0 { 0.0 } else { x });
        prop_assert_eq!(&text, &reference(x));
        if x != 0.0 {
            let shortest = format!("{:e}", x.abs());
            let digits = |t: &str| {
                let m = t.split(['e', 'E']).next().unwrap();
                let d: String = m.chars().filter(char::is_ascii_digit).collect();
                d.trim_matches('0').len()
            };
            prop_assert_eq!(digits(&text), digits(&shortest));
        }
    }
}
