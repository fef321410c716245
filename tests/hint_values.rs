//! Every server hint header and odd value it may carry (negative, NaN, fractional, huge,
//! infinite), each either clamped to `MAX_HINT` or ignored exactly as `classify::hint` documents.

use std::time::Duration;
use stormguard::classify::hint::ServerHint;
use stormguard::classify::hint::MAX_HINT;
use stormguard::classify::{
    retry_info_delay, ClassifiedResponse, Classify, HttpClassifier, ModelApiClassifier,
};

use ServerHint::{DoNotRetry, RetryAfter};

fn hint_of<C: Classify<http::Response<()>, std::io::Error>>(
    classifier: C,
    status: u16,
    headers: &[(&str, &str)],
) -> ServerHint {
    let mut resp = http::Response::builder().status(status);
    for (k, v) in headers {
        resp = resp.header(*k, *v);
    }
    match classifier.classify(&Ok(resp.body(()).unwrap())) {
        ClassifiedResponse::Ready(c) => c.hint(),
        _ => unreachable!(),
    }
}

const MS: fn(u64) -> Duration = Duration::from_millis;
const S: fn(u64) -> Duration = Duration::from_secs;

#[test]
fn retry_after_delay_seconds() {
    // RFC 9110: delay-seconds is 1*DIGIT; anything else that is not an HTTP date is ignored.
    let table: &[(&str, ServerHint)] = &[
        ("1", RetryAfter(S(1))),
        (" 7 ", RetryAfter(S(7))),
        ("0", RetryAfter(Duration::ZERO)),
        ("86400", RetryAfter(MAX_HINT)),
        ("86401", RetryAfter(MAX_HINT)),
        ("99999999999999999999999999", RetryAfter(MAX_HINT)),
        ("-1", ServerHint::None),
        ("1.5", ServerHint::None),
        ("1e400", ServerHint::None),
        ("inf", ServerHint::None),
        ("Infinity", ServerHint::None),
        ("NaN", ServerHint::None),
        ("", ServerHint::None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", RetryAfter(Duration::ZERO)), // a date in the past
        ("Fri, 31 Dec 9999 23:59:59 GMT", RetryAfter(MAX_HINT)),
    ];
    let wrong: Vec<_> = table
        .iter()
        .filter_map(|&(v, want)| {
            let got = hint_of(HttpClassifier, 429, &[("retry-after", v)]);
            (got != want).then(|| format!("Retry-After {v:?}: got {got:?}, want {want:?}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn retry_after_ms_clamps_the_huge_and_the_infinite_and_ignores_the_rest() {
    // Documented: `retry-after-ms`, else `Retry-After`, both clamped to MAX_HINT. A value that is
    // no delay at all (negative, NaN, text) is ignored, and `Retry-After` is read instead.
    let table: &[(&str, ServerHint, ServerHint)] = &[
        // (retry-after-ms, alone, beside `Retry-After: 3`)
        ("250", RetryAfter(MS(250)), RetryAfter(MS(250))),
        (
            "12.5",
            RetryAfter(Duration::from_micros(12_500)),
            RetryAfter(Duration::from_micros(12_500)),
        ),
        ("0", RetryAfter(Duration::ZERO), RetryAfter(Duration::ZERO)),
        ("-0", RetryAfter(Duration::ZERO), RetryAfter(Duration::ZERO)),
        ("86400000", RetryAfter(MAX_HINT), RetryAfter(MAX_HINT)),
        ("1e30", RetryAfter(MAX_HINT), RetryAfter(MAX_HINT)),
        ("1e400", RetryAfter(MAX_HINT), RetryAfter(MAX_HINT)),
        ("inf", RetryAfter(MAX_HINT), RetryAfter(MAX_HINT)),
        ("+Infinity", RetryAfter(MAX_HINT), RetryAfter(MAX_HINT)),
        ("Infinity", RetryAfter(MAX_HINT), RetryAfter(MAX_HINT)),
        ("-5", ServerHint::None, RetryAfter(S(3))),
        ("-inf", ServerHint::None, RetryAfter(S(3))),
        ("-1e400", ServerHint::None, RetryAfter(S(3))),
        ("NaN", ServerHint::None, RetryAfter(S(3))),
        ("soon", ServerHint::None, RetryAfter(S(3))),
        ("", ServerHint::None, RetryAfter(S(3))),
    ];
    let mut wrong = Vec::new();
    for &(v, alone, beside) in table {
        let got = hint_of(ModelApiClassifier, 429, &[("retry-after-ms", v)]);
        if got != alone {
            wrong.push(format!("retry-after-ms {v:?}: got {got:?}, want {alone:?}"));
        }
        let got = hint_of(
            ModelApiClassifier,
            429,
            &[("retry-after-ms", v), ("retry-after", "3")],
        );
        if got != beside {
            wrong.push(format!(
                "retry-after-ms {v:?} + Retry-After 3: got {got:?}, want {beside:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn grpc_pushback_is_a_32_bit_count_or_do_not_retry() {
    // gRFC A6: a non-negative 32-bit integer of milliseconds; negative or malformed (not an
    // integer, out of range, infinite) means "do not retry". In range, clamped to MAX_HINT.
    let table: &[(&str, ServerHint)] = &[
        ("250", RetryAfter(MS(250))),
        ("0", RetryAfter(Duration::ZERO)),
        ("86400000", RetryAfter(MAX_HINT)),
        ("2147483647", RetryAfter(MAX_HINT)),
        ("2147483648", DoNotRetry),
        ("-1", DoNotRetry),
        ("1.5", DoNotRetry),
        ("1e3", DoNotRetry),
        ("1e400", DoNotRetry),
        ("inf", DoNotRetry),
        ("Infinity", DoNotRetry),
        ("NaN", DoNotRetry),
        ("", DoNotRetry),
    ];
    let mut wrong = Vec::new();
    for &(v, want) in table {
        // A trailers-only gRPC answer (UNAVAILABLE), and the same header on a plain 503.
        let grpc = hint_of(
            HttpClassifier,
            200,
            &[("grpc-status", "14"), ("grpc-retry-pushback-ms", v)],
        );
        let plain = hint_of(HttpClassifier, 503, &[("grpc-retry-pushback-ms", v)]);
        for got in [grpc, plain] {
            if got != want {
                wrong.push(format!("pushback {v:?}: got {got:?}, want {want:?}"));
            }
        }
        #[cfg(feature = "tonic")]
        {
            let got = tonic_hint(Some(v), &[]);
            if got != want {
                wrong.push(format!("tonic pushback {v:?}: got {got:?}, want {want:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A protobuf varint.
fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

fn len_field(tag: u8, bytes: &[u8]) -> Vec<u8> {
    [&[tag][..], &varint(bytes.len() as u64), bytes].concat()
}

/// A `google.rpc.Status` (UNAVAILABLE) whose details hold one `RetryInfo` of `seconds`, `nanos`
/// (int64 and int32 as protobuf encodes them: negative as ten-byte two's complement).
fn status_with_retry_info(seconds: i64, nanos: i32) -> Vec<u8> {
    let delay = [
        &[0x08][..],
        &varint(seconds as u64),
        &[0x10],
        &varint(i64::from(nanos) as u64),
    ]
    .concat();
    let info = len_field(0x0a, &delay);
    let any = [
        len_field(0x0a, b"type.googleapis.com/google.rpc.RetryInfo"),
        len_field(0x12, &info),
    ]
    .concat();
    [&[0x08, 14][..], &len_field(0x1a, &any)].concat()
}

#[test]
fn grpc_retry_info_clamps_the_huge_and_ignores_the_negative() {
    // Documented: clamped to MAX_HINT; `None` if malformed or negative.
    let table: &[(i64, i32, Option<Duration>)] = &[
        (1, 500_000_000, Some(MS(1_500))),
        (0, 0, Some(Duration::ZERO)),
        (86_400, 0, Some(MAX_HINT)),
        (315_576_000_000, 999_999_999, Some(MAX_HINT)), // google.protobuf.Duration's maximum
        (i64::MAX, 999_999_999, Some(MAX_HINT)),
        (-1, 0, None),
        (i64::MIN, 0, None),
        (0, -1, None),
        (1, 1_000_000_000, None),
        (1, i32::MAX, None),
    ];
    let mut wrong = Vec::new();
    for &(seconds, nanos, want) in table {
        let details = status_with_retry_info(seconds, nanos);
        let got = retry_info_delay(&details);
        if got != want {
            wrong.push(format!(
                "RetryInfo {seconds} s {nanos} ns: got {got:?}, want {want:?}"
            ));
        }
        #[cfg(feature = "tonic")]
        {
            let want = want.map_or(ServerHint::None, RetryAfter);
            let got = tonic_hint(None, &details);
            if got != want {
                wrong.push(format!(
                    "tonic RetryInfo {seconds} s: got {got:?}, want {want:?}"
                ));
            }
        }
    }
    // Cut short anywhere, the details are malformed: ignored, never a panic.
    let details = status_with_retry_info(1, 0);
    for end in 0..details.len() {
        assert_eq!(retry_info_delay(&details[..end]), None, "cut at {end}");
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The hint of a server-sent UNAVAILABLE `tonic::Status` with this pushback and details.
#[cfg(feature = "tonic")]
fn tonic_hint(pushback: Option<&str>, details: &[u8]) -> ServerHint {
    let mut meta = tonic::metadata::MetadataMap::new();
    meta.insert("content-type", "application/grpc".parse().unwrap());
    if let Some(v) = pushback {
        meta.insert("grpc-retry-pushback-ms", v.parse().unwrap());
    }
    let status = tonic::Status::with_details_and_metadata(
        tonic::Code::Unavailable,
        "busy",
        details.to_vec().into(),
        meta,
    );
    stormguard::classify::classify_error(&status).hint()
}
