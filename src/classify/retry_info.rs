//! `google.rpc.RetryInfo` read from a gRPC status's details (`grpc-status-details-bin`): the
//! server's own "retry after this long", as gRFC A6 and AIP-194 describe it.
//!
//! The details are a serialized `google.rpc.Status` (`code` = 1, `message` = 2, `details` = 3,
//! repeated `google.protobuf.Any` { `type_url` = 1, `value` = 2 }); a `RetryInfo` holds
//! `retry_delay` = 1, a `google.protobuf.Duration` { `seconds` = 1, `nanos` = 2 }. A few lines of
//! protobuf reading, bounded by the bytes given, instead of a dependency on generated types.

use std::time::Duration;

const RETRY_INFO: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The delay a `RetryInfo` in `details` asks for, clamped to [`MAX_HINT`](super::hint::MAX_HINT)
/// as every server hint is; `None` if there is none, or it is malformed or negative.
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::retry_info_delay;
///
/// // google.rpc.Status { details: [Any { type_url: ...RetryInfo, value: RetryInfo { retry_delay: 1.5 s } }] }
/// let delay = [0x08, 0x01, 0x10, 0x80, 0xCA, 0xB5, 0xEE, 0x01]; // seconds 1, nanos 500,000,000
/// let info = [&[0x0a, delay.len() as u8][..], &delay].concat();
/// let url = b"type.googleapis.com/google.rpc.RetryInfo";
/// let any = [&[0x0a, url.len() as u8][..], url, &[0x12, info.len() as u8], &info].concat();
/// let status = [&[0x08, 14, 0x1a, any.len() as u8][..], &any].concat();
/// assert_eq!(retry_info_delay(&status), Some(Duration::from_millis(1_500)));
/// assert_eq!(retry_info_delay(b"not protobuf"), None);
/// ```
pub fn retry_info_delay(details: &[u8]) -> Option<Duration> {
    fields(details).find_map(|field| match field {
        (3, Value::Bytes(any)) => {
            let mut type_url = None;
            let mut value = None;
            for field in fields(any) {
                match field {
                    (1, Value::Bytes(url)) => type_url = Some(url),
                    (2, Value::Bytes(v)) => value = Some(v),
                    _ => {}
                }
            }
            if type_url? != RETRY_INFO.as_bytes() {
                return None;
            }
            let delay = fields(value?).find_map(|f| match f {
                (1, Value::Bytes(d)) => Some(d),
                _ => None,
            })?;
            let (mut seconds, mut nanos) = (0i64, 0i64);
            for field in fields(delay) {
                match field {
                    (1, Value::Varint(v)) => seconds = v as i64,
                    (2, Value::Varint(v)) => nanos = i64::from(v as i32),
                    _ => {}
                }
            }
            if seconds < 0 || !(0..1_000_000_000).contains(&nanos) {
                return None;
            }
            Some(Duration::new(seconds as u64, nanos as u32).min(super::hint::MAX_HINT))
        }
        _ => None,
    })
}

enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// The fields of one protobuf message, until the bytes end or stop making sense.
fn fields(mut bytes: &[u8]) -> impl Iterator<Item = (u64, Value<'_>)> {
    std::iter::from_fn(move || {
        let tag = varint(&mut bytes)?;
        let value = match tag & 7 {
            0 => Value::Varint(varint(&mut bytes)?),
            1 => Value::Bytes(take(&mut bytes, 8)?),
            2 => {
                let len = usize::try_from(varint(&mut bytes)?).ok()?;
                Value::Bytes(take(&mut bytes, len)?)
            }
            5 => Value::Bytes(take(&mut bytes, 4)?),
            _ => return None,
        };
        Some((tag >> 3, value))
    })
}

fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if bytes.len() < n {
        return None;
    }
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Some(head)
}
