//! The receipt layer's default codec: it stores an answer by its type, as the default
//! classifier reads one.

use super::codec::Codec;
use crate::error::BoxError;

/// An answer the receipt layer's default codec ([`DefaultCodec`]) knows how to store: an
/// `http::Response` whose body is in memory (status, headers and body, as [`HttpCodec`](super::HttpCodec)),
/// JSON values, strings, bytes, numbers, and an rmcp `CallToolResult` (feature `rmcp`).
///
/// For your own serde type, one line ([`stored_as_json!`](crate::stored_as_json)), or give the
/// layer `.codec(JsonCodec)`:
///
/// ```
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Sent { message_id: String }
///
/// stormguard::stored_as_json!(Sent);
/// ```
#[diagnostic::on_unimplemented(
    message = "the receipt layer's default codec does not know how to store a `{Self}`",
    label = "`{Self}` does not implement `stormguard::receipt::Stored`",
    note = "for a serde type give the layer `.codec(JsonCodec)` or `impl Stored for {Self}`; an `http::Response` is stored when its body is in memory (`String`, `Vec<u8>`, `Bytes`): collect a streamed body (hyper's `Incoming`, a reqwest response) into one first, or store what the tool returns; a streamed answer that must not be stored, or a declared tool that records no receipt: `.codec(NotStored)`"
)]
pub trait Stored: Sized {
    /// Whether the answer can be stored at all (`true`). `false` for a streamed answer whose
    /// body is not in memory (a `reqwest::Response`): the receipt layer then records the intent
    /// and stamps the key, and a success leaves the intent pending, as with
    /// [`NotStored`](super::NotStored).
    const STORED: bool = true;
    /// The bytes of the receipt.
    fn to_receipt(&self) -> Result<Vec<u8>, BoxError>;
    /// The answer a receipt stands for.
    fn from_receipt(bytes: &[u8]) -> Result<Self, BoxError>;
}

/// The receipt layer's default codec: stores any [`Stored`] answer.
///
/// ```
/// use stormguard::receipt::{Codec, DefaultCodec};
///
/// let answer = http::Response::builder().status(201).body("sent".to_string()).unwrap();
/// let bytes = DefaultCodec.encode(&answer).unwrap();
/// let back: http::Response<String> = DefaultCodec.decode(&bytes).unwrap();
/// assert_eq!((back.status().as_u16(), back.body().as_str()), (201, "sent"));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultCodec;

impl<Res: Stored> Codec<Res> for DefaultCodec {
    fn encode(&self, res: &Res) -> Result<Vec<u8>, BoxError> {
        res.to_receipt()
    }

    fn decode(&self, bytes: &[u8]) -> Result<Res, BoxError> {
        Res::from_receipt(bytes)
    }

    fn stores(&self) -> bool {
        Res::STORED
    }
}

/// A `reqwest::Response` is a streamed answer (its body is read after it arrives): the default
/// codec stores nothing of it, as [`NotStored`](super::NotStored), so a declared tool whose body
/// answers one needs no codec. A tool that records receipts should answer what it read
/// (`http::Response<String>`, its JSON): the stack says so when it is built.
#[cfg(any(feature = "reqwest", feature = "reqwest-0_13"))]
macro_rules! reqwest_not_stored {
    ($r:ident) => {
        impl Stored for $r::Response {
            const STORED: bool = false;

            fn to_receipt(&self) -> Result<Vec<u8>, BoxError> {
                Err("a reqwest::Response is a streamed answer: its body is not stored".into())
            }

            fn from_receipt(_: &[u8]) -> Result<Self, BoxError> {
                Err("a reqwest::Response is never stored as a receipt".into())
            }
        }
    };
}
#[cfg(feature = "reqwest")]
reqwest_not_stored!(reqwest);
#[cfg(feature = "reqwest-0_13")]
reqwest_not_stored!(reqwest013);

#[cfg(feature = "http")]
impl<B: super::StoredBody> Stored for http::Response<B> {
    fn to_receipt(&self) -> Result<Vec<u8>, BoxError> {
        super::HttpCodec.encode(self)
    }

    fn from_receipt(bytes: &[u8]) -> Result<Self, BoxError> {
        super::HttpCodec.decode(bytes)
    }
}

/// Implements [`Stored`](crate::receipt::Stored) for serde types: their receipts are their JSON.
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Charged { charge_id: String }
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Refunded { refund_id: String }
///
/// stormguard::stored_as_json!(Charged, Refunded);
/// ```
#[macro_export]
macro_rules! stored_as_json {
    ($($t:ty),* $(,)?) => {$(
        impl $crate::receipt::Stored for $t {
            fn to_receipt(&self) -> ::std::result::Result<::std::vec::Vec<u8>, $crate::error::BoxError> {
                ::std::result::Result::Ok($crate::__private::serde_json::to_vec(self)?)
            }

            fn from_receipt(bytes: &[u8]) -> ::std::result::Result<Self, $crate::error::BoxError> {
                ::std::result::Result::Ok($crate::__private::serde_json::from_slice(bytes)?)
            }
        }
    )*};
}

crate::stored_as_json!(
    serde_json::Value,
    String,
    Vec<u8>,
    bool,
    (),
    u8,
    u16,
    u32,
    u64,
    usize,
    i32,
    i64
);

#[cfg(feature = "rmcp")]
crate::stored_as_json!(rmcp::model::CallToolResult);
